"""Segments of layers as one graphable callable each: a chain of per-layer callables that shares its static inputs."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["LayerChain", "segment_callables"]


class LayerChain(torch.nn.Module):
    """Graphable per-layer callables of one signature ``(hidden_states, *static) -> hidden_states`` one after the
    other, as one callable: a segment of ``graph_unit: run``
    (:func:`~bridge_cudagraph.plan.budgets.layer_segments`) in the budgeted helpers (vision, packed language). Every
    link reads the same static inputs, and only the last output is read outside (a segment ends wherever other code
    reads or changes the hidden states), so the chain is one launch and one backward node instead of one per layer, and
    no copy of each layer's output into the next graph's static input."""

    def __init__(self, links: Sequence[torch.nn.Module]) -> None:
        super().__init__()
        self.links = torch.nn.ModuleList(links)

    def forward(self, hidden_states: torch.Tensor, *static: torch.Tensor) -> torch.Tensor:
        for link in self.links:
            hidden_states = link(hidden_states, *static)
        return hidden_states


def segment_callables(layers: Sequence[torch.nn.Module], segments, wrap) -> tuple[torch.nn.Module, ...]:
    """One callable per segment ``[start, end)`` of ``layers``: ``wrap(layer)`` alone, or a :class:`LayerChain` of
    them."""
    return tuple(
        wrap(layers[start]) if end - start == 1 else LayerChain([wrap(layer) for layer in layers[start:end]])
        for start, end in segments
    )
