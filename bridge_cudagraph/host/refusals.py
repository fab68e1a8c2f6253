"""A host refusal in one line that names the settings: what megatron-core or Bridge checked, read off the raising
frame.

The host's own configuration checks often say what is wrong without saying which setting holds it: a bare
``assert self.offload_modules is not None and len(self.offload_modules) > 0`` prints ``AssertionError``, and
``CUDA graphs not supported with CPU offloading.`` names neither ``model.cpu_offloading`` nor the fix. The frame that
raised knows both: the asserted condition, or the ``if`` around the ``raise``, in the host's source, and the config
object the check ran on (``self``), whose attributes the condition reads. :func:`host_refusal_line` turns that into
one line; the CLI prints it for an ``AssertionError`` or ``ValueError`` raised inside megatron-core or Bridge.

Host change:
  changes: nothing: reads the raising host frame (its source file through ``linecache``, its ``self``)
  written for: megatron-core 0.19.2 and Bridge 0.6.2 configuration checks (``assert`` and ``if ...: raise``)
  gate: the innermost frame of the error is in a host library's code
  undo: nothing to undo
"""

from __future__ import annotations

import ast
import functools
import linecache
import re
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["host_refusal_line"]

#: The top-level package folders of the host libraries whose frames are read.
HOST_PACKAGES = ("megatron",)


def host_refusal_line(error: BaseException) -> str | None:
    """One line for ``error`` as raised by the host: its message (or the failed assertion), where, and the settings the
    check reads, as ``model.<field>`` on a model config; None where no host frame raised it (the error is not the
    host's) or the source cannot be read."""
    frame = _raising_host_frame(error.__traceback__)
    if frame is None:
        return None
    code, lineno = frame.tb_frame.f_code, frame.tb_lineno
    condition = _checked_condition(code.co_filename, lineno)
    owner = frame.tb_frame.f_locals.get("self")
    settings = _settings_read(condition or "", owner)
    message = " ".join(str(error).split())
    what = message or (f"assert {condition}" if condition else type(error).__name__)
    where = f"{_short(code.co_filename)}:{lineno}"
    named = [s for s in settings if s.rsplit(".", 1)[-1] not in message]
    checker = _checker(code)
    if not settings or (not named and message):
        return f"{checker} refused the configuration: {what} ({where})"
    listed = ", ".join(settings)
    return (
        f"{checker} refused the configuration: {what} ({where}); the check reads {listed}: change "
        f"{'it' if len(settings) == 1 else 'them'}"
    )


def _raising_host_frame(tb: TracebackType | None) -> TracebackType | None:
    """The innermost traceback entry, where it is in a host library's code (else the error is not the host's)."""
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last if last is not None and _is_host_file(last.tb_frame.f_code.co_filename) else None


def _is_host_file(filename: str) -> bool:
    parts = Path(filename).parts
    return any(p in parts for p in HOST_PACKAGES) and "bridge_cudagraph" not in parts


def _short(filename: str) -> str:
    parts = Path(filename).parts
    start = max(i for i, p in enumerate(parts) if p in HOST_PACKAGES)
    return "/".join(parts[start:])


@functools.cache
def _tree(filename: str) -> tuple[ast.AST, str] | None:
    source = "".join(linecache.getlines(filename))
    if not source:
        return None
    try:
        return ast.parse(source), source
    except SyntaxError:
        return None


def _checked_condition(filename: str, lineno: int) -> str | None:
    """The source of the condition that failed at ``lineno``: an ``assert``'s test, or the test of the innermost
    ``if`` whose body holds the ``raise``."""
    parsed = _tree(filename)
    if parsed is None:
        return None
    tree, source = parsed

    def holds(node: ast.stmt) -> bool:
        return node.lineno <= lineno <= (node.end_lineno or node.lineno)

    statements = [n for n in ast.walk(tree) if isinstance(n, ast.Assert | ast.Raise) and holds(n)]
    if not statements:
        return None
    statement = max(statements, key=lambda n: n.lineno)
    if isinstance(statement, ast.Assert):
        return _segment(source, statement.test)
    guards = [n for n in ast.walk(tree) if isinstance(n, ast.If) and holds(n) and _in_body(n, statement)]
    return _segment(source, max(guards, key=lambda n: n.lineno).test) if guards else None


def _in_body(guard: ast.If, statement: ast.AST) -> bool:
    return any(statement is node for child in guard.body for node in ast.walk(child))


def _segment(source: str, node: ast.AST) -> str | None:
    text = ast.get_source_segment(source, node)
    return None if text is None else " ".join(text.split())


def _settings_read(condition: str, owner: Any) -> list[str]:
    """``self.<name>`` attributes of ``owner`` the condition reads that are its settings (not methods), named as a
    recipe names them."""
    if owner is None:
        return []
    section = "model" if _is_model_config(owner) else type(owner).__name__
    names: list[str] = []
    for name in re.findall(r"\bself\.([A-Za-z_]\w*)", condition):
        if name not in names and not name.startswith("_") and not callable(getattr(owner, name, None)):
            names.append(name)
    return [f"{section}.{name}" for name in names]


def _is_model_config(owner: Any) -> bool:
    return any(cls.__name__ in ("TransformerConfig", "ModelParallelConfig") for cls in type(owner).__mro__)


def _checker(code: Any) -> str:
    """``megatron-core's TransformerConfig.__post_init__``: the library and the function that raised."""
    parts = Path(code.co_filename).parts
    library = "Megatron-Bridge" if "bridge" in parts else "megatron-core"
    return f"{library}'s {getattr(code, 'co_qualname', code.co_name)}"
