"""A hook ahead of every ``AutoBridge.from_hf_pretrained`` call in a block.

Host change:
  changes: ``AutoBridge.from_hf_pretrained`` (:func:`from_hf_pretrained_hook`)
  written for: Bridge 0.6.2
  gate: a recipe with ``hf_config``
  undo: leaving the block
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from bridge_cudagraph.host.changes import ORIGINAL

__all__ = ["from_hf_pretrained_hook"]


@contextlib.contextmanager
def from_hf_pretrained_hook(before: Callable[[str, dict[str, Any]], None]) -> Iterator[None]:
    """Call ``before(path, kwargs)`` ahead of every ``AutoBridge.from_hf_pretrained(path, **kwargs)`` in the block.

    Patches: the classmethod ``megatron.bridge.models.conversion.auto_bridge.AutoBridge.from_hf_pretrained``
    (Bridge 0.6.2), which Bridge's recipe functions call with the model id (and some with a pinned ``revision``).
    Why: :func:`bridge_cudagraph.recipe.offline.offline_hf_config` must lay the committed ``config.json`` out under the
    revision the recipe asks for, and refuse another model at once, before Bridge's own loading code (unchanged)
    runs. ``before`` may raise to refuse the call. Undone when the block is left: the class gets back the very
    ``classmethod`` object from its ``__dict__``.
    """
    from megatron.bridge.models.conversion.auto_bridge import AutoBridge

    original = AutoBridge.__dict__["from_hf_pretrained"]

    def from_hf_pretrained(cls, path, **kwargs):
        before(str(path), kwargs)
        return original.__func__(cls, path, **kwargs)

    wrapper = functools.wraps(original.__func__)(from_hf_pretrained)
    setattr(wrapper, ORIGINAL, original)
    AutoBridge.from_hf_pretrained = classmethod(wrapper)
    try:
        yield
    finally:
        AutoBridge.from_hf_pretrained = original
