"""``torch.cuda.get_device_properties`` answered by a stand-in on a machine without CUDA, for the length of a block.

Host change:
  changes: ``torch.cuda.get_device_properties`` on machines without CUDA (:func:`cpu_device_properties`), for
    Bridge 0.6.2's MoE recipes
  written for: torch (any)
  gate: no CUDA device
  undo: leaving the block
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

from bridge_cudagraph.host.changes import ORIGINAL

__all__ = ["cpu_device_properties"]


@contextlib.contextmanager
def cpu_device_properties() -> Iterator[None]:
    """On a machine without CUDA, ``torch.cuda.get_device_properties`` answers with a stand-in during the block.

    Patches: ``torch.cuda.get_device_properties`` (any torch; only when ``torch.cuda.is_available()`` is false). Why:
    Megatron-Bridge 0.6.2 ``apply_flex_dispatcher_backend`` (``training/flex_dispatcher_backend.py``) calls
    ``torch.cuda.get_device_properties(0)`` for every MoE model before it looks at the requested backend, so
    ``qwen3_vl_30b_a3b_sft_config`` raises "Found no NVIDIA driver" on a CPU machine. With no backend requested (all
    our recipes) the properties are only read in a branch that logs and returns. On a machine with CUDA nothing is
    patched. Undone when the block is left.
    """
    import torch

    if torch.cuda.is_available():
        yield
        return
    original = torch.cuda.get_device_properties

    def no_device(device: Any = None) -> types.SimpleNamespace:
        return types.SimpleNamespace(name="no CUDA device", major=0, minor=0, total_memory=0, multi_processor_count=0)

    setattr(no_device, ORIGINAL, original)
    torch.cuda.get_device_properties = no_device  # type: ignore[assignment]  # a namespace of the fields read
    try:
        yield
    finally:
        torch.cuda.get_device_properties = original
