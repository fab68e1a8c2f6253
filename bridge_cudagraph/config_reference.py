"""The configuration reference of the README, generated from the ``model.cuda_graph`` block's field docstrings.

The fields' attribute docstrings in :mod:`bridge_cudagraph.config` are the one description of each setting; the
README shows them between two markers, and ``tests/unit/test_config_reference.py`` fails when the README's copy and
the code differ. Regenerate with ``python -m bridge_cudagraph.config_reference --write README.md``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import sys
from collections.abc import Sequence
from pathlib import Path

START = "<!-- config-reference:start (python -m bridge_cudagraph.config_reference --write README.md) -->"
END = "<!-- config-reference:end -->"


def field_docs(module=None) -> dict[str, dict[str, str]]:
    """Class name -> field name -> its attribute docstring, read from the module's source (Python keeps no
    attribute docstrings at runtime)."""
    if module is None:
        from bridge_cudagraph import config as module
    tree = ast.parse(inspect.getsource(module))
    out: dict[str, dict[str, str]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        docs = out.setdefault(node.name, {})
        for stmt, after in zip(node.body, node.body[1:], strict=False):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return out


def _blocks():
    from bridge_cudagraph.config import SUB_BLOCKS, CudaGraphConfig

    parts = tuple((f"model.cuda_graph.{name}", cls) for name, cls in SUB_BLOCKS.items())
    return (*parts, ("model.cuda_graph", CudaGraphConfig))


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "required"
    if dataclasses.is_dataclass(value):
        return "(block)"
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else repr(value)


def render() -> str:
    """The README's reference: one table per block, each field with its default and its docstring, in the order the
    dataclasses declare them (inherited fields first)."""
    from bridge_cudagraph.config import SUB_BLOCKS

    docs = field_docs()
    lines = [START, ""]
    for where, cls in _blocks():
        lines += [f"`{where}`:", "", "| setting | default | what it does |", "|---|---|---|"]
        for field in dataclasses.fields(cls):
            if field.name in SUB_BLOCKS:
                continue
            owner = next(c.__name__ for c in cls.__mro__ if field.name in docs.get(c.__name__, {}))
            text = " ".join(docs[owner][field.name].split()).replace("``", "`").replace("|", "\\|")
            lines.append(f"| `{field.name}` | `{_default(field)}` | {text} |")
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def splice(readme: str, reference: str) -> str:
    """``readme`` with the text between the markers replaced by ``reference`` (which carries the markers)."""
    if START not in readme or END not in readme:
        raise ValueError(f"the README has no {START!r} ... {END!r} markers")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return head + reference + tail


def main(argv: Sequence[str] | None = None) -> int:
    """Print the reference, or write it into a README between its markers."""
    parser = argparse.ArgumentParser(prog="python -m bridge_cudagraph.config_reference", description=__doc__)
    parser.add_argument("--write", metavar="README", help="replace the block between the markers of this file")
    args = parser.parse_args(argv)
    reference = render()
    if args.write is None:
        print(reference)
        return 0
    path = Path(args.write)
    path.write_text(splice(path.read_text(), reference))
    return 0


if __name__ == "__main__":
    sys.exit(main())
