"""The static input buffers a capture writes before each replay: the dtype activations have inside the layers, the
shapes a built model's config gives them (rows per rank, rotary width), and the buffers the rungs of one graph copy
share."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["StaticBuffers", "activation_dtype", "rotary_dim", "sequence_split"]


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


def sequence_split(config) -> int:
    """The ranks a built language layer's sequence is cut over: ``tp`` under sequence parallelism (each rank holds
    ``1/tp`` of the rows), else 1; the plan's :attr:`~bridge_cudagraph.plan.facts.ModelFacts.sequence_split`, read
    from the model's own config."""
    return config.tensor_model_parallel_size if config.sequence_parallel else 1


def rotary_dim(config) -> int:
    """Width of the rotary table each attention layer reads (``kv_channels x rotary_percent``, ``kv_channels``
    defaulting to the head width); the plan's :attr:`~bridge_cudagraph.plan.facts.ModelFacts.rotary_dim`."""
    return int((config.kv_channels or config.hidden_size // config.num_attention_heads) * config.rotary_percent)


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
