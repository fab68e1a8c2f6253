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
