"""Every keyword argument that the product and the benchmarks pass to a function or class they import names one of its
parameters.

Much of both runs only on a GPU (the capture, the benchmark's variants), so a call there that names a keyword the
callee does not have fails first on the device, after minutes of start-up: the benchmark's ``prepare`` once built
:class:`benchmarks.runner.StepData` with two fields it does not have, and every variant failed before its first step.
This test reads every module's source, resolves each call's callee the way the module binds it (a module-level name,
``module.attribute``, or an import inside the enclosing function, which wins over the module's name), and checks the
keywords against :func:`inspect.signature`. A callee that takes ``**kwargs``, a name bound any other way inside the
function (an argument, an assignment), and a callee without a signature are left alone: the test errs towards
silence, never towards a false alarm.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import types
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.fast

PACKAGES = ("bridge_cudagraph", "benchmarks")


def _modules() -> list[types.ModuleType]:
    found = []
    for name in PACKAGES:
        package = importlib.import_module(name)
        found.append(package)
        for info in pkgutil.walk_packages(package.__path__, f"{name}."):
            if ".tests" in info.name or info.name.endswith("__main__"):  # tests; __main__ runs the CLI on import
                continue
            found.append(importlib.import_module(info.name))
    return found


def _module(name: str) -> types.ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:  # an optional dependency this machine lacks: the name resolves to nothing
        return None


def _imported(module: str, name: str) -> Any:
    source = _module(module)
    value = getattr(source, name, None) if source is not None else None
    return value if value is not None else _module(f"{module}.{name}")


def _import_bindings(nodes: list[ast.AST]) -> dict[str, Any]:
    """The names the import statements among ``nodes`` bind, to what they bind (None where it cannot be known here:
    a relative import, a module this machine lacks)."""
    bound: dict[str, Any] = {}
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                absolute = node.level == 0 and node.module
                bound[alias.asname or alias.name] = _imported(node.module, alias.name) if absolute else None
        elif isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.asname or alias.name.split(".")[0]
                bound[name] = _module(alias.name if alias.asname else name)
    return bound


def _local_names(function: ast.AST) -> set[str]:
    """Names a function binds other than by import: its arguments and every name it stores."""
    args = function.args  # type: ignore[attr-defined]
    names = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _resolve(expr: ast.AST, names: dict[str, Any]) -> Any:
    if isinstance(expr, ast.Name):
        return names.get(expr.id)
    if isinstance(expr, ast.Attribute):
        base = _resolve(expr.value, names)
        if isinstance(base, types.ModuleType):
            return getattr(base, expr.attr, None)
    return None


def _unknown_keywords(module: types.ModuleType) -> list[str]:
    path = Path(module.__file__ or "")
    tree = ast.parse(path.read_text())
    found: list[str] = []

    def visit(node: ast.AST, names: dict[str, Any]) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            imports = _import_bindings(list(ast.walk(node)))
            shadowed = _local_names(node) - set(imports)
            names = {k: v for k, v in {**names, **imports}.items() if k not in shadowed}
        if isinstance(node, ast.Call) and node.keywords:
            found.extend(_check(node, _resolve(node.func, names), path))
        for child in ast.iter_child_nodes(node):
            visit(child, names)

    visit(tree, dict(vars(module)))
    return found


def _check(call: ast.Call, callee: Any, path: Path) -> list[str]:
    if callee is None or not callable(callee):
        return []
    try:
        parameters = inspect.signature(callee).parameters
    except (TypeError, ValueError):
        return []
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return []
    return [
        f"{path.parent.name}/{path.name}:{call.lineno}: {ast.unparse(call.func)}() has no parameter {kw.arg!r}"
        for kw in call.keywords
        if kw.arg is not None
        and (kw.arg not in parameters or parameters[kw.arg].kind is inspect.Parameter.POSITIONAL_ONLY)
    ]


def test_every_keyword_names_a_parameter_of_its_callee():
    modules = _modules()
    assert len(modules) > 100  # the walk reached the package's and the benchmarks' modules
    problems = [p for module in modules for p in _unknown_keywords(module)]
    assert not problems, "\n".join(problems)


def test_a_keyword_the_callee_lacks_is_found(tmp_path, monkeypatch):
    """The check on a module written for it: the StepData call ``prepare`` once made, and a local import that
    shadows a module-level name of the same spelling (only the former is a problem)."""
    (tmp_path / "keyword_probe.py").write_text(
        "from benchmarks import runner\n"
        "def profile(steps):\n"
        "    return steps\n"
        "def built(world):\n"
        "    return runner.StepData(world=world, batches=[], fixed_batch={}, plan=[], warmup_steps=0,\n"
        "                           measured_steps=1, profile_steps=0, cfg=None)\n"
        "def profiled():\n"
        "    from torch.profiler import profile\n"
        "    return profile(activities=[])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("keyword_probe")
    assert [p.split(": ", 1)[1] for p in _unknown_keywords(module)] == ["runner.StepData() has no parameter 'cfg'"]
