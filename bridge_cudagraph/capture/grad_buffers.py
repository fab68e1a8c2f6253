"""The gradient buffers a capture touches: DDP's, which TE's warmup passes write into, and the parameters whose weight
gradient TE accumulates into ``main_grad`` inside a graph."""

from __future__ import annotations

__all__ = ["fused_grad_params", "zero_grad_buffers"]


def zero_grad_buffers(model_chunks) -> None:
    """Zero the DDP gradient buffers of ``model_chunks``: TE's warmup passes before a capture wrote gradients into
    them, which megatron-core's helper clears the same way."""
    for chunk in model_chunks:
        zero = getattr(chunk, "zero_grad_buffer", None)
        if zero is not None:
            zero()


def fused_grad_params(layers) -> list:
    """The parameters of ``layers`` whose weight gradient TE accumulates into ``main_grad`` inside a graph (TE's
    Python marked them ``grad_added_to_main_grad`` during capture); a replay runs no TE Python, so the budgeted
    helpers mark them again before each replay."""
    return [p for layer in layers for p in layer.parameters() if getattr(p, "grad_added_to_main_grad", False)]
