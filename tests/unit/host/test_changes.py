"""``bridge_cudagraph.host.changes``: each module-level name of the host is rebound by one module of ``host/`` only,
the one the index names, so an upgrade re-reads one module per change."""

from __future__ import annotations

import ast
from pathlib import Path

import bridge_cudagraph

#: Each host name the package rebinds (an attribute assigned, or an entry of ``sys.modules`` set or deleted), and the
#: one module allowed to do it.
REBINDINGS = {
    "TECudaGraphHelper": "host/bridge_helper.py",
    "train": "host/training_loop.py",
    "compile_helpers": "host/dataset_helpers.py",
    "HF_HUB_OFFLINE": "host/offline_hub.py",
    "HF_HUB_CACHE": "host/offline_hub.py",
    "from_hf_pretrained": "host/from_hf_pretrained.py",
    "get_device_properties": "host/cpu_device_properties.py",
    "reset_model_temporary_tensors": "host/finalize.py",
    "sys.modules": "host/bridge_recipes.py",
}


def _rebound(tree: ast.AST) -> set[str]:
    """The names of :data:`REBINDINGS` that ``tree`` assigns or deletes: ``x.NAME = ...`` (also inside a tuple
    target), ``sys.modules[...] = ...`` and ``del sys.modules[...]``."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        else:
            continue
        stack = list(targets)
        while stack:
            target = stack.pop()
            if isinstance(target, ast.Tuple | ast.List):
                stack.extend(target.elts)
            elif isinstance(target, ast.Attribute) and target.attr in REBINDINGS:
                found.add(target.attr)
            elif isinstance(target, ast.Subscript) and ast.unparse(target.value) == "sys.modules":
                found.add("sys.modules")
    return found


def test_each_host_name_is_rebound_by_its_own_module_only():
    """Each module makes its rebindings (so the check looks for what real code writes), and no other module of the
    package rebinds those names."""
    root = Path(bridge_cudagraph.__file__).parent
    trees = {str(path.relative_to(root)): ast.parse(path.read_text()) for path in sorted(root.rglob("*.py"))}
    for name, owner in REBINDINGS.items():
        assert name in _rebound(trees[owner]), (owner, name)
    offenders = [
        f"{module}: {name}" for module, tree in trees.items() for name in _rebound(tree) if REBINDINGS[name] != module
    ]
    assert not offenders, offenders


def test_the_check_sees_a_rebinding():
    tree = ast.parse("a.train = f\nconstants.HF_HUB_OFFLINE, b.c = 1, 2\ndel sys.modules[k]\nself.training = True\n")
    assert _rebound(tree) == {"train", "HF_HUB_OFFLINE", "sys.modules"}


def test_the_index_names_each_rebinding_module():
    """Every module that rebinds a host name is in the index of changes, with the name it rebinds."""
    root = Path(bridge_cudagraph.__file__).parent
    index = ast.get_docstring(ast.parse((root / "host" / "changes.py").read_text()))
    for name, owner in REBINDINGS.items():
        assert f"- ``{Path(owner).stem}``: " in index, owner
        assert name in index, (owner, name)
