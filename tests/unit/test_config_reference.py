"""The README's configuration reference is the code's: generated from the field docstrings of the block."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bridge_cudagraph import config_reference
from bridge_cudagraph.config import SUB_BLOCKS, CudaGraphConfig

pytestmark = pytest.mark.fast

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_holds_the_generated_reference():
    """Regenerate with ``python -m bridge_cudagraph.config_reference --write README.md`` after changing a field."""
    text = README.read_text()
    assert config_reference.START in text and config_reference.END in text
    assert config_reference.splice(text, config_reference.render()) == text


def test_every_field_of_every_block_is_in_the_reference():
    reference = config_reference.render()
    for cls in (*SUB_BLOCKS.values(), CudaGraphConfig):
        for field in dataclasses.fields(cls):
            if field.name in SUB_BLOCKS:
                assert f"`model.cuda_graph.{field.name}`:" in reference, field.name
                continue
            assert f"| `{field.name}` |" in reference, (cls.__name__, field.name)


def test_a_changed_docstring_shows_as_a_stale_readme():
    """The check can fail: a README whose block differs from the code's is detected."""
    text = README.read_text()
    stale = config_reference.splice(text, config_reference.render().replace("| `enabled` |", "| `enable` |", 1))
    assert stale != text
    assert config_reference.splice(stale, config_reference.render()) == text


def test_the_table_keeps_the_first_sentence_and_what_none_means():
    doc = (
        "Static lengths (one per budget, e.g. 64. or more), ascending. Refused when unsorted. ``None`` derives a "
        "ladder (rungs at most 1.25x apart); the plan says which. A last word."
    )
    assert config_reference.sentences(doc)[0] == "Static lengths (one per budget, e.g. 64. or more), ascending."
    assert config_reference.brief(doc) == (
        "Static lengths (one per budget, e.g. 64. or more), ascending. ``None`` derives a ladder."
    )
    assert config_reference.brief("One sentence only") == "One sentence only"


def test_the_full_reference_holds_every_docstring_whole():
    full, brief = config_reference.render(full=True), config_reference.render()
    assert len(full) > len(brief)
    # warmup_steps' default: what None means is in both, its detail only in the full text.
    assert "`None` uses the model's `cuda_graph_warmup_steps`" in brief
    assert "(3 in Megatron-Core)" in full and "(3 in Megatron-Core)" not in brief
    assert ":mod:" not in brief and ":class:" not in brief
