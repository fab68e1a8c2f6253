"""MoE layers on the packed ladder (:mod:`bridge_cudagraph.capture.packed`): per rung and copy, one graph per MoE
layer that holds the layer's attention, router and dispatch preprocess; the dispatch, the experts and the combine run
eagerly after it, then the layer's post-MLP residual add. ``docs/design/moe-packed.md`` has the reasoning.

* **The graph** (:class:`PackedMoEHead`): the layer's attention on the rung's static ``cu_seqlens`` (the
  ``PackedSeqParams`` rebuilt inside, as for a dense packed layer), then its MLP step in megatron-core's partial scope
  ``[attn, moe_router, moe_preprocess]`` (the provider sets it on the config), with a static **padding mask**
  ``[1, B/tp]``, True on the rung's tail ``[T, B)``. The MoE layer returns early after its dispatch preprocess, and
  its outputs (the permuted hidden states, the probabilities, the dispatcher's tensors, the residual) are the graph's.
* **The mask** is filled per replay from the micro-batch's token count (a host number): two device fills, no wait
  (:meth:`PackedMoE.load_mask`). Under megatron-core 0.19.2 it keeps the tail out of the router's z loss, out of the
  auxiliary losses (their scores and routing map) and out of their token counts, so those are the real tokens' as in
  Bridge's packed eager step. It does **not** keep the tail out of the dispatch: ``TopKRouter.routing`` returns the
  unmasked routing map, so each tail token goes to top-k experts (all tail rows are zeros, so the same experts) and
  comes back as zeros, and its gradient is zero; the experts' grouped GEMMs see those extra rows after the real ones.
* **The eager remainder** (:meth:`PackedMoE.remainder`, the ladder's
  :attr:`~bridge_cudagraph.capture.language_ladder.LanguageLadder.segment_remainder`, which
  :func:`~bridge_cudagraph.capture.block_replay.replay_segments`' ``after_segment`` runs after the MoE layer's graph,
  before any deepstack merge of that layer): megatron-core's own partial replay
  (:func:`bridge_cudagraph.host.moe_partial.resume`), with the dispatcher's shapes of the rung put back.
* **Counted**: the tokens each rung masked (``stats.masked_tokens``), next to the replays and the fallbacks.

Dense layers of the same model stay whole-layer graphs (:class:`MaskBlind`: every graph of a set reads the same
static inputs, the mask last). An MoE layer is always a graph of its own (the plan resolves ``graph_unit`` to
``layer`` on an MoE model).

Nothing here has run on a GPU: megatron-core's router and dispatcher need CUDA. ``tests/gpu/test_packed_moe.py`` is
what proves it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from megatron.core.packed_seq_params import PackedSeqParams

from bridge_cudagraph.capture.checks import CaptureError
from bridge_cudagraph.capture.static_inputs import StaticBuffers
from bridge_cudagraph.capture.stats import CaptureStats
from bridge_cudagraph.host import moe_partial

__all__ = ["MaskBlind", "PackedMoE", "PackedMoEHead", "fill_padding_mask", "packed_seq_params"]


def packed_seq_params(
    cu_seqlens: torch.Tensor, cu_seqlens_padded: torch.Tensor | None, max_seqlen: int
) -> PackedSeqParams:
    """The ``PackedSeqParams`` of a packed graph, built from its static ``cu_seqlens`` (and a separate padded copy
    where the data path has one), as :class:`~bridge_cudagraph.capture.packed.PackedGraphSet`'s dense layers build
    theirs."""
    padded = None if cu_seqlens_padded is None else cu_seqlens_padded
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu_seqlens,
        cu_seqlens_kv=cu_seqlens,
        cu_seqlens_q_padded=padded,
        cu_seqlens_kv_padded=padded,
        max_seqlen_q=max_seqlen,
        max_seqlen_kv=max_seqlen,
    )


class PackedMoEHead(torch.nn.Module):
    """One MoE layer's graphed part on a rung: ``(hidden_states, rotary, cu_seqlens[, cu_seqlens_padded],
    padding_mask) -> (hidden_states, probs, *dispatcher tensors, [shared experts' output,] residual)``, tensors
    only, as :func:`bridge_cudagraph.host.moe_partial.mlp_head` returns them."""

    def __init__(self, layer: torch.nn.Module, max_seqlen: int) -> None:
        super().__init__()
        self.layer = layer
        self.max_seqlen = max_seqlen

    def forward(self, hidden_states, rotary_pos_emb, cu_seqlens, *rest):
        *padded, padding_mask = rest
        params = packed_seq_params(cu_seqlens, padded[0] if padded else None, self.max_seqlen)
        h = moe_partial.attention(self.layer, hidden_states, rotary_pos_emb, params)
        return tuple(moe_partial.mlp_head(self.layer, h, padding_mask))


class MaskBlind(torch.nn.Module):
    """A dense layer's packed callable in a model with MoE layers: it takes the same static inputs as the MoE graphs
    (the padding mask last) and hands the layer all but the mask."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, hidden_states, *statics):
        return self.inner(hidden_states, *statics[:-1])


def fill_padding_mask(mask: torch.Tensor, rows: int) -> None:
    """``mask`` (``[1, B/tp]`` bool) False on the real rows ``[0, rows)`` and True on the tail: two fills on the
    device, sized by a host number, so nothing waits for the GPU."""
    mask[:, :rows].fill_(False)
    mask[:, rows:].fill_(True)


class PackedMoE:
    """The MoE layers of one decoder on the packed ladder: their callables, the rung's padding mask, the dispatcher's
    shapes per rung, the eager remainder after each MoE layer's graph, and the tokens masked per rung.

    Args:
        decoder: The decoder (``TransformerBlock``) whose layers are captured.
        segments: The layer ranges ``[start, end)`` of its graphs (the plan's); each MoE layer must be one of its own.
        stats: The helper's stats, whose :attr:`~bridge_cudagraph.capture.stats.CaptureStats.masked_tokens` this
            counts into.

    Raises:
        CaptureError: An MoE layer that is not a graph of its own, or that the partial scope cannot capture
            (:func:`bridge_cudagraph.host.moe_partial.check_partial_scope`).
    """

    def __init__(self, decoder: Any, segments: Sequence[tuple[int, int]], stats: CaptureStats) -> None:
        self.stats = stats
        self.moe_layers = frozenset(i for i, layer in enumerate(decoder.layers) if moe_partial.is_moe_layer(layer))
        alone = {start for start, end in segments if end - start == 1}
        for index in sorted(self.moe_layers):
            if index not in alone:
                raise CaptureError(
                    f"language: MoE layer {index} shares a graph with other layers ({list(segments)}); packed MoE "
                    "layers need graph_unit 'layer' (the plan resolves it so)"
                )
            why = moe_partial.check_partial_scope(decoder.layers[index])
            if why is not None:
                raise CaptureError(f"language: packed MoE layer {index} cannot be captured: {why}")
        #: ``{local rows of a rung: {layer index: dispatcher shapes}}``, recorded when the rung is captured.
        self.shapes: dict[int, dict[int, dict[str, Any]]] = {}

    @classmethod
    def of(cls, decoders: Sequence[Any], segments: Sequence, stats: CaptureStats) -> PackedMoE | None:
        """The MoE layers of the ladder's decoder (one model chunk per rank), or None for a dense model."""
        if not decoders or not any(moe_partial.is_moe_layer(layer) for layer in decoders[0].layers):
            return None
        return cls(decoders[0], segments[0], stats)

    # ------------------------------------------------------------------ capture
    def wrap(self, layer: torch.nn.Module, dense: Callable[[torch.nn.Module], torch.nn.Module], max_seqlen: int):
        """The graphed callable of one layer: :class:`PackedMoEHead` for an MoE layer, ``dense(layer)`` behind
        :class:`MaskBlind` for a dense one."""
        if moe_partial.is_moe_layer(layer):
            return PackedMoEHead(layer, max_seqlen)
        return MaskBlind(dense(layer))

    @staticmethod
    def mask_view(statics: StaticBuffers, budget: int, tp: int) -> torch.Tensor:
        """The rung's static padding mask ``[1, budget / tp]`` (all False until a replay fills it), a view of the
        copy's one buffer as every rung's static inputs are."""
        return statics.view("padding_mask", (budget // tp,), torch.bool).unsqueeze(0)

    def record_shapes(self, decoder: Any, rows: int) -> None:
        """After a rung of ``rows`` local rows is captured: each MoE layer's dispatcher shapes, which its replays put
        back (:func:`bridge_cudagraph.host.moe_partial.dispatcher_shapes`)."""
        self.shapes[rows] = {i: moe_partial.dispatcher_shapes(decoder.layers[i]) for i in self.moe_layers}

    # ------------------------------------------------------------------ replay
    @staticmethod
    def misfit(params: PackedSeqParams) -> tuple[str, str] | None:
        """Why a packed micro-batch cannot replay the MoE graphs, or None: a ``tokens_per_sample`` asks megatron-core
        to route each sample as its own row (``_maybe_unflatten_for_moe``), which a rung with a tail cannot divide."""
        if getattr(params, "tokens_per_sample", None) is not None:
            return ("moe-rows", "packed_seq_params.tokens_per_sample is set (per-sample MoE routing)")
        return None

    def load_mask(self, mask: torch.Tensor, *, budget: int, tokens: int, tp: int) -> None:
        """Fill the rung's mask for a micro-batch of ``tokens`` (``T'`` when tightly packed) at ``budget``; the tail
        ``budget - tokens`` is counted as masked at that rung."""
        fill_padding_mask(mask, tokens // tp)
        masked = self.stats.masked_tokens
        masked[budget] = masked.get(budget, 0) + budget - tokens

    def remainder(self, block: Any, end: int, outputs: Any) -> torch.Tensor:
        """After the graph of the segment that ends before layer ``end``: the eager rest of an MoE layer on the
        graph's outputs (:func:`bridge_cudagraph.host.moe_partial.resume`); a dense segment's output unchanged. An MoE
        layer is a segment of its own (checked at construction), so the segment is layer ``end - 1`` alone."""
        index = end - 1
        if index not in self.moe_layers:
            return outputs
        residual = outputs[-1]
        shapes = self.shapes.get(residual.size(0))
        if shapes is None:
            raise RuntimeError(
                f"bridge_cudagraph: no dispatcher shapes recorded for a packed MoE rung of {residual.size(0)} rows"
            )
        return moe_partial.resume(block.layers[index], outputs, shapes[index])
