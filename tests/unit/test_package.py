"""The package's public names resolve, and importing the package pulls in neither torch nor Megatron."""

from __future__ import annotations

import subprocess
import sys

import bridge_cudagraph


def test_every_export_resolves():
    for name in bridge_cudagraph.__all__:
        assert getattr(bridge_cudagraph, name) is not None, name


def test_import_is_light():
    code = "import sys, bridge_cudagraph; sys.exit(any(m in sys.modules for m in ('torch', 'megatron')))"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def _readme_paths() -> list[str]:
    """The repository paths the README names in backticks (``bridge_cudagraph/plan/build.py``, ``recipes/README.md``,
    ``results/``...): anything with a folder in it and a file suffix, or ending in a slash."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    names = re.findall(r"`([A-Za-z0-9_.][A-Za-z0-9_./-]*)`", text) + re.findall(r"\]\(([A-Za-z0-9_./-]+)\)", text)
    return sorted({n for n in names if "/" in n and (n.endswith("/") or re.search(r"\.(py|md|yaml|sh|json|png)$", n))})


def test_every_path_the_readme_names_exists():
    """The README cannot go stale: each file it names (code to read, results to open) is tracked, each folder holds
    tracked files."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout
    files = set(tracked.split())
    paths = _readme_paths()
    assert "bridge_cudagraph/plan/build.py" in paths, paths
    assert "results/packed-2b-speed/" in paths, paths
    missing = [p for p in paths if (not any(f.startswith(p) for f in files) if p.endswith("/") else p not in files)]
    assert not missing, f"README.md names paths that are not in the repository: {missing}"


def test_the_shipped_package_holds_no_benchmark_or_harness_code():
    """pyproject ships bridge_cudagraph* only, and nothing under it is benchmark, leak-finder or harness code."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["bridge_cudagraph*"]
    assert not any("matplotlib" in d for d in project["project"]["dependencies"])
    tracked = subprocess.run(
        ["git", "ls-files", "bridge_cudagraph"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    assert not [f for f in tracked if "bench" in Path(f).name or "leak" in f or "/harness/" in f]


def _package_imports(root) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at module level or inside a function (both run at some point),
    leaving out ``if TYPE_CHECKING:`` blocks (never run); a module's import also runs its parent packages."""
    import ast

    modules = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    edges: dict[str, set[str]] = {name: set() for name in modules}

    def targets(name: str) -> set[str]:
        found = set()
        while name:
            if name in modules:
                found.add(name)
            name = name.rpartition(".")[0]
        return found

    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        skipped = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for stmt in node.body
            for n in ast.walk(stmt)
        }
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    edges[name] |= targets(alias.name)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                edges[name] |= targets(base)
                for alias in node.names:
                    edges[name] |= targets(f"{base}.{alias.name}") - targets(base)
        edges[name].discard(name)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_cycle():
    """No module of the package imports, even inside a function, a module that imports it back (directly or around a
    loop): each layer can be read, tested and changed without the ones above it."""
    from pathlib import Path

    edges = _package_imports(Path(bridge_cudagraph.__file__).parent)
    assert (
        "bridge_cudagraph.capture.vision" in edges and edges["bridge_cudagraph.bridge.callback"]
    )  # the walk sees edges
    assert _cycles(edges) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


#: The package root: the CLI, the ``model.cuda_graph`` block and its reference, and the micro-batch context every
#: folder reads (the forward step in ``bridge``/``testing`` opens it; ``host``, ``vision`` and ``capture`` read it);
#: everything else in a folder by concern.
ROOT_MODULES = {"__init__.py", "__main__.py", "cli.py", "config.py", "config_reference.py", "micro_batch.py"}
FOLDERS = {"recipe", "plan", "parallel", "bridge", "capture", "vision", "host", "examples", "testing"}


def test_the_package_root_holds_folders_by_concern():
    """Modules do not pile up at the root again: a new one goes into the folder of its concern."""
    from pathlib import Path

    root = Path(bridge_cudagraph.__file__).parent
    files = {p.name for p in root.glob("*.py")}
    folders = {p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert files == ROOT_MODULES and folders == FOLDERS, (sorted(files - ROOT_MODULES), sorted(folders ^ FOLDERS))


def _host_blocks(text: str) -> list[dict[str, str]]:
    """The ``Host change:`` blocks of a module docstring, as key -> text."""
    import re

    blocks = []
    for chunk in text.split("Host change:")[1:]:
        body = chunk.split("\n\n")[0]
        fields = dict(re.findall(r"\n  (changes|written for|gate|undo): (.*(?:\n    .*)*)", body))
        blocks.append(fields)
    return blocks


def _indexed_changes(text: str) -> dict[str, int]:
    """Module -> how many changes the index of ``host/changes.py`` lists for it (its ``- ``module``: ...`` lines)."""
    import re

    counts: dict[str, int] = {}
    for name in re.findall(r"^- ``(\w+)``: ", text, re.M):
        counts[name] = counts.get(name, 0) + 1
    return counts


#: The modules of ``host/`` that change nothing themselves: the probes and the index of every change.
HOST_WITHOUT_CHANGES = ("__init__", "compat", "changes")


def test_every_host_module_opens_with_its_changes():
    """Each module of ``host/`` (but the probes and the index) says, per change, what it changes, the release it was
    written for, its gate and its undo; the folder's index names every module, and the index of changes
    (``host/changes.py``) lists each change of each module once, so an upgrade reads every change in one place."""
    import ast
    from pathlib import Path

    folder = Path(bridge_cudagraph.__file__).parent / "host"
    index = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
    changes = _indexed_changes(ast.get_docstring(ast.parse((folder / "changes.py").read_text())))
    modules = sorted(p.stem for p in folder.glob("*.py") if p.stem not in HOST_WITHOUT_CHANGES)
    assert len(modules) >= 8, modules
    for name in modules:
        doc = ast.get_docstring(ast.parse((folder / f"{name}.py").read_text()))
        blocks = _host_blocks(doc)
        assert blocks, f"host/{name}.py has no 'Host change:' block"
        for block in blocks:
            assert set(block) == {"changes", "written for", "gate", "undo"}, (name, block)
            assert all(v.strip() for v in block.values()), (name, block)
        assert f"``{name}``" in index, f"host/__init__.py does not list {name}"
        assert changes.get(name, 0) == len(blocks), f"host/changes.py lists {changes.get(name, 0)} changes of {name}"
    assert "``changes``" in index
    assert set(changes) <= set(modules), f"host/changes.py lists modules that are gone: {set(changes) - set(modules)}"


def test_the_index_of_host_changes_is_read_as_written():
    """The index parser above counts the list lines of each module (not their continuation lines), so a change
    missing from the index is seen."""
    text = "Names:\n\n- ``a``: ``x.y``; Bridge 0.6.2; undo ``u``\n- ``b``: ``z``; any;\n  - ``c``: leaving\n"
    assert _indexed_changes(text + "- ``a``: ``w``\n") == {"a": 2, "b": 1}


def test_class_swaps_and_rebindings_happen_in_the_host_folder_only():
    """An object's class is swapped, and a host module's name rebound, only in ``host/`` (through
    ``host.instance_class.extend_instance_class`` and the other modules there): grep the rest of the package for the
    statements."""
    import re
    from pathlib import Path

    root = Path(bridge_cudagraph.__file__).parent
    found = []
    for path in root.rglob("*.py"):
        if path.parent.name == "host":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if re.search(r"\.__class__\s*=[^=]|setattr\((megatron|transformer_engine|torch)\b", code):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    assert not found, found


#: The top-level packages of the host, for imports.
HOST_PACKAGES = ("megatron", "transformer_engine")


def _host_private_names() -> set[str]:
    """Every private name megatron-core, Megatron-Bridge and Transformer Engine define (functions, classes,
    attributes they assign), read off their installed sources."""
    import importlib.util
    import re
    from pathlib import Path

    found: set[str] = set()
    definition = re.compile(r"(?:\bdef\s+|\bclass\s+|\.|^\s*)(_[A-Za-z]\w*)\s*(?:\(|=|:)", re.M)
    for package in ("megatron.core", "megatron.bridge", "transformer_engine"):
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations, package
        for location in spec.submodule_search_locations:
            for path in Path(location).rglob("*.py"):
                found.update(definition.findall(path.read_text(errors="ignore")))
    return {name for name in found if not name.startswith("__")}


def _private_reads(tree, host_names: set[str], ours: set[str]) -> list[tuple[int, str]]:
    """``(line, name)`` of each read of a host private name in ``tree``: an attribute (whatever object it is read
    from, ``self`` too: a subclass reading its base's state), a ``getattr``/``setattr``/``hasattr`` by literal name,
    or an import from megatron or TE; a name this package defines itself (outside host/) is its own."""
    import ast

    def named(name: str) -> bool:
        return name in host_names and name not in ours

    def of_torch(node) -> bool:  # torch's own privates (``torch.cuda._sleep``) are torch's, not the host's
        while isinstance(node, ast.Attribute):
            node = node.value
        return isinstance(node, ast.Name) and node.id == "torch"

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and named(node.attr) and not of_torch(node):
            out.append((node.lineno, node.attr))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in (
            "megatron",
            "transformer_engine",
        ):
            out.extend((node.lineno, a.name) for a in node.names if a.name.startswith("_"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and named(node.args[1].value)
        ):
            out.append((node.lineno, node.args[1].value))
    return out


def _own_private_names(trees) -> set[str]:
    """Private names the given modules define: functions, classes, arguments, and attributes or names they assign."""
    import ast

    ours: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                ours.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                ours.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                ours.add(node.id)
            elif isinstance(node, ast.arg):
                ours.add(node.arg)
    return {name for name in ours if name.startswith("_")}


def test_host_internals_are_read_in_the_host_folder_only():
    """No module of the package (and of the benchmarks) outside ``host/`` reads a private name of megatron-core,
    Bridge or TE: each goes through a named accessor in ``host/compat.py`` (release noted there), so a host release
    that renames one breaks one place, with no exception."""
    import ast
    from pathlib import Path

    package = Path(bridge_cudagraph.__file__).parent
    repo = package.parent
    paths = [p for p in package.rglob("*.py") if p.parent.name != "host"] + sorted((repo / "benchmarks").glob("*.py"))
    trees = {str(p.relative_to(repo)): ast.parse(p.read_text()) for p in paths}
    ours = _own_private_names(trees.values())
    host = _host_private_names()
    found = [
        f"{name}:{line}: {private}"
        for name, tree in trees.items()
        for line, private in _private_reads(tree, host, ours)
    ]
    assert not found, found


def test_the_host_internals_check_sees_a_private_read():
    """The check above can fail: a read of megatron-core's ``_set_capture_end`` and an import of Bridge's
    ``_pad_and_pack_qwen3_vl_step`` are found; the package's own private names are not."""
    import ast

    tree = ast.parse(
        "from megatron.bridge.models.qwen_vl.qwen3_vl_step import _pad_and_pack_qwen3_vl_step\n"
        "cuda_graphs._set_capture_end()\n"
        "getattr(provider, '_pg_collection', None)\n"
        "self._own_thing = 1\n"
        "self._own_thing\n"
    )
    host = _host_private_names()
    assert {"_set_capture_end", "_pg_collection"} <= host
    reads = _private_reads(tree, host, _own_private_names([tree]))
    assert sorted(reads) == [(1, "_pad_and_pack_qwen3_vl_step"), (2, "_set_capture_end"), (3, "_pg_collection")]


def test_the_package_cites_host_code_by_symbol_not_line():
    """Docstrings and comments name the host's functions and files, never a line number: lines move with every
    release of Bridge or megatron-core, and a stale number misleads more than none."""
    import re
    from pathlib import Path

    root = Path(bridge_cudagraph.__file__).parent
    cited = re.compile(r"\b[\w/]+\.py:\d+")
    found = [
        f"{path.relative_to(root)}:{number}: {match.group(0)}"
        for path in sorted(root.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        for match in cited.finditer(line)
    ]
    assert not found, found


#: Module-level containers the package may change after import, and why each is not a run's state.
PROCESS_WIDE = {
    # One extended class per (host class, mixin) pair: the same class object for every instance, never a run's data.
    ("bridge_cudagraph/host/instance_class.py", "_EXTENDED_CLASSES"),
    # The micro-batch context itself: a ContextVar, whose value the forward step opens and closes.
    ("bridge_cudagraph/micro_batch.py", "_CURRENT"),
}


def _changed_module_containers(tree) -> set[str]:
    """Names bound at module level to a container (a literal, a collection or weak collection, a ContextVar) that
    the module changes later (a method that mutates, an item assigned or deleted), or that a ``global`` rebinds."""
    import ast

    mutators = {"append", "add", "update", "pop", "setdefault", "clear", "extend", "remove", "discard", "set"}
    kinds = ("dict", "list", "set", "WeakSet", "WeakKeyDictionary", "WeakValueDictionary", "defaultdict", "ContextVar")
    containers = set()
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        is_container = isinstance(value, (ast.Dict, ast.List, ast.Set)) or (
            isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] in kinds
        )
        if is_container:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            containers |= {t.id for t in targets if isinstance(t, ast.Name)}
    changed, rebound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            rebound |= set(node.names)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in mutators:
            if isinstance(node.func.value, ast.Name):
                changed.add(node.func.value.id)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            for target in getattr(node, "targets", None) or [node.target]:
                if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                    changed.add(target.value.id)
    return (changed & containers) | rebound


def test_the_package_keeps_no_run_state_in_module_globals():
    """A run's state (its graphs' owner, a micro-batch's grids or rows) travels in objects: the provider, the
    callback, the micro-batch context. A module-level registry would outlive its run and mix runs of one process;
    only the listed process-wide caches are changed after import."""
    import ast
    from pathlib import Path

    package = Path(bridge_cudagraph.__file__).parent
    found = {
        (str(p.relative_to(package.parent)), name)
        for p in package.rglob("*.py")
        for name in _changed_module_containers(ast.parse(p.read_text()))
    }
    assert found == PROCESS_WIDE, sorted(found ^ PROCESS_WIDE)


def test_the_module_globals_check_sees_a_registry():
    """The check above can fail: a registry filled by a function, an item assigned, a ``global`` rebinding."""
    import ast

    tree = ast.parse(
        "import weakref\n"
        "_OWNERS = {}\n_CALLBACKS = weakref.WeakSet()\n_LAST = None\n_NAMES = ('a',)\n"
        "def claim(c, o):\n    _OWNERS[id(c)] = o\n"
        "def register(cb):\n    _CALLBACKS.add(cb)\n"
        "def remember(x):\n    global _LAST\n    _LAST = x\n"
    )
    assert _changed_module_containers(tree) == {"_OWNERS", "_CALLBACKS", "_LAST"}
