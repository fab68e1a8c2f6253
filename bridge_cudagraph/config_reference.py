"""The configuration reference of the README, generated from the ``model.cuda_graph`` block's field docstrings.

The fields' attribute docstrings in :mod:`bridge_cudagraph.config` are the one description of each setting; the
README shows their first sentence and what their ``None`` means (:func:`brief`) between two markers, and
``tests/unit/test_config_reference.py`` fails when the README's copy and the code differ. Regenerate with
``python -m bridge_cudagraph.config_reference --write README.md``; ``--full`` prints every docstring whole.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
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


#: A Sphinx role before a backquoted name (``:mod:`` and its kin, with ``~``).
_SPHINX_ROLE = re.compile(r":[a-z]+:`~?")

#: Words whose period ends no sentence.
_ABBREVIATIONS = ("e.g", "i.e", "etc", "vs", "cf")


def sentences(text: str) -> list[str]:
    """``text`` cut after each ``.`` that ends a sentence: followed by a space or the end, outside backquotes and
    parentheses, not an abbreviation's (:data:`_ABBREVIATIONS`)."""
    text = " ".join(text.split())
    out, start, depth, quoted = [], 0, 0, False
    for i, char in enumerate(text):
        if char == "`":
            quoted = not quoted
        elif not quoted and char in "([":
            depth += 1
        elif not quoted and char in ")]":
            depth = max(0, depth - 1)
        elif char == "." and not quoted and depth == 0 and (i + 1 == len(text) or text[i + 1] == " "):
            word = text[start:i].rsplit(" ", 1)[-1].lower()
            if word not in _ABBREVIATIONS:
                out.append(text[start : i + 1].strip())
                start = i + 1
    if text[start:].strip():
        out.append(text[start:].strip())
    return out


def brief(doc: str) -> str:
    """What the README's table says of a setting: its docstring's first sentence, and the sentences that say what its
    ``None`` (its default where it has one) means. The whole docstring stays in :mod:`bridge_cudagraph.config`
    (``--full`` prints it)."""
    parts = sentences(doc)
    kept = parts[:1] + [_first_clause(p) for p in parts[1:] if p.startswith(("``None``", "`None`"))]
    return " ".join(kept)


def _first_clause(sentence: str) -> str:
    """``sentence`` up to its first ``;`` or `` (`` outside backquotes (the default's meaning without its details)."""
    quoted = False
    for i, char in enumerate(sentence):
        if char == "`":
            quoted = not quoted
        elif not quoted and (char == ";" or sentence.startswith(" (", i)):
            return sentence[:i].rstrip(",") + "."
    return sentence


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


def render(full: bool = False) -> str:
    """The README's reference: one table per block, each field with its default and :func:`brief` of its docstring
    (``full``: the whole docstring), in the order the dataclasses declare them (inherited fields first)."""
    from bridge_cudagraph.config import SUB_BLOCKS

    docs = field_docs()
    lines = [START, ""]
    for where, cls in _blocks():
        lines += [f"`{where}`:", "", "| setting | default | what it does |", "|---|---|---|"]
        for field in dataclasses.fields(cls):
            if field.name in SUB_BLOCKS:
                continue
            owner = next(c.__name__ for c in cls.__mro__ if field.name in docs.get(c.__name__, {}))
            doc = docs[owner][field.name]
            text = " ".join((doc if full else brief(doc)).split()).replace("``", "`").replace("|", "\\|")
            text = _SPHINX_ROLE.sub("`", text)  # :mod:`x` reads as `x` in markdown
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
    parser.add_argument("--full", action="store_true", help="print every setting's whole docstring")
    args = parser.parse_args(argv)
    if args.full:
        print(render(full=True))
        return 0
    reference = render()
    if args.write is None:
        print(reference)
        return 0
    path = Path(args.write)
    path.write_text(splice(path.read_text(), reference))
    return 0


if __name__ == "__main__":
    sys.exit(main())
