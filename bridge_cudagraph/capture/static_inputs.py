"""The static input buffers a capture writes before each replay: the dtype activations have inside the layers, and the
buffers the rungs of one graph copy share."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["StaticBuffers", "activation_dtype"]


def activation_dtype(config) -> torch.dtype:
    """The dtype activations have inside the layers: Float16Module casts to bf16/fp16, else fp32.

    Megatron-Core's static inputs are hard-coded bf16 (``module.py`` ``get_layer_static_inputs``); TE then
    converts fp16/fp32 activations into that buffer *silently* at replay, losing precision.
    """
    if getattr(config, "fp16", False):
        return torch.float16
    if getattr(config, "bf16", False):
        return torch.bfloat16
    return torch.float32


class StaticBuffers:
    """The static input buffers the rungs of one graph copy share: each rung's are views of the first rows of one
    buffer, allocated at the largest rung of a capture.

    For the rungs of one copy only, which replay one rung per micro-batch, forward then backward, before another rung
    of the copy runs; each copy has its own (``docs/design/shared-pool.md`` says why sharing is then safe). A later,
    larger rung (:class:`~bridge_cudagraph.capture.budget_ladder.BudgetLadder` growth) gets a new buffer; the earlier
    views keep theirs.
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self._device = device

    def view(self, name: str, shape: Sequence[int], dtype: torch.dtype, *, requires_grad: bool = False):
        """A ``shape`` view (the first ``shape[0]`` rows) of the buffer ``name``; a leaf when ``requires_grad``."""
        shape = tuple(int(n) for n in shape)
        buffer = self._buffers.get(name)
        if buffer is None or buffer.dtype != dtype or buffer.shape[1:] != shape[1:] or buffer.size(0) < shape[0]:
            device = self._device if self._device is not None else torch.cuda.current_device()
            buffer = self._buffers[name] = torch.zeros(shape, dtype=dtype, device=device)
        view = buffer[: shape[0]]
        return view.requires_grad_(True) if requires_grad else view

    def nbytes(self) -> int:
        """Bytes of the buffers held now."""
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def clear(self) -> None:
        """Drop the buffers (graphs deleted)."""
        self._buffers.clear()
