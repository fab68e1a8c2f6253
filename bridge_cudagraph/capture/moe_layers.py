"""MoE layers on the ladder, packed (:mod:`bridge_cudagraph.capture.packed`) and padded
(:mod:`bridge_cudagraph.capture.padded`): per rung and copy, one graph per MoE layer that holds the layer's attention;
the layer's MLP half (pre-MLP norm, router, dispatch, experts, combine, residual add) runs eagerly after it on the
micro-batch's **real rows only**, a packed rung's tail passed around it. ``docs/design/moe-packed.md`` has the
reasoning and what was measured.

A padded micro-batch has no tail: its rows are the rung's, padding included, as Bridge's padded step routes them, so
the MLP half runs on every row and only the graph's callable differs (:class:`PaddedMoEAttention`, the attention on
the ``(S, mbs, H)`` rows with the causal mask TE applies itself).

Why the MLP half runs on the real rows: a static rung is ``B`` rows wide and the micro-batch fills ``T <= B`` of them.
Every kernel of the attention half treats rows independently or by the static ``cu_seqlens`` (the tail is segments
of its own), which the dense packed suites prove equal to Bridge's eager step bit for bit. The MoE half does not: the
router's weight gradient sums over every row it sees, and the experts' grouped GEMMs take their blocking from the
rows routed to each expert, so a tail that reaches the router or the experts changes their numbers (measured: the
loss and the router's weight gradient then part from Bridge's MoE model where two eager runs agree bit for bit). On
the first ``T`` rows the MoE half sees exactly the rows of Bridge's packed eager step, in the same order, so its
routing, its auxiliary and z losses, its token counts and its expert GEMMs are Bridge's. Under sequence parallelism
at tp > 1 only a micro-batch of its rung's width replays (``packed_misfit``'s ``split``): no tail, and each rank's
``T/tp`` local rows are the eager step's slice.

* **The graph** (:class:`PackedMoEAttention`): the layer's attention on the rung's static ``cu_seqlens`` (the
  ``PackedSeqParams`` rebuilt inside, as for a dense packed layer); its output is the hidden states after the
  attention's residual add.
* **The eager half** (:meth:`MoELayers.remainder`, the ladder's
  :attr:`~bridge_cudagraph.capture.language_ladder.LanguageLadder.segment_remainder`, which
  :func:`~bridge_cudagraph.capture.block_replay.replay_segments`' ``after_segment`` runs after the MoE layer's graph,
  before any deepstack merge of that layer): ``TransformerLayer._forward_mlp`` on rows ``[0, T)``
  (:func:`bridge_cudagraph.host.compat.layer_mlp`), the tail rows ``[T, B)`` carried on unchanged (they hold only
  tail segments, which no real row attends to, and carry no loss).
* **Counted**: the tail tokens each rung kept out of the MoE layers (``stats.moe_tail_tokens``), next to the
  replays and the fallbacks.

Dense layers of the same model stay whole-layer graphs. An MoE layer is always a graph of its own (the plan resolves
``graph_unit`` to ``layer`` on an MoE model), so its eager half follows its own graph.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from megatron.core.packed_seq_params import PackedSeqParams

from bridge_cudagraph.capture.checks import CaptureError
from bridge_cudagraph.capture.stats import CaptureStats
from bridge_cudagraph.host import compat

__all__ = [
    "MoELayers",
    "PackedMoEAttention",
    "PaddedMoEAttention",
    "is_moe_layer",
    "packed_seq_params",
    "run_on_real_rows",
]


def is_moe_layer(layer: Any) -> bool:
    """Whether a decoder layer's MLP is megatron-core's ``MoELayer`` (``TransformerLayer.is_moe_layer``)."""
    return bool(getattr(layer, "is_moe_layer", False))


def packed_seq_params(
    cu_seqlens: torch.Tensor, cu_seqlens_padded: torch.Tensor | None, max_seqlen: int
) -> PackedSeqParams:
    """The ``PackedSeqParams`` of a packed graph, built from its static ``cu_seqlens`` (and a separate padded copy
    where the data path has one), as :class:`~bridge_cudagraph.capture.packed.PackedGraphSet`'s dense layers build
    theirs."""
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu_seqlens,
        cu_seqlens_kv=cu_seqlens,
        cu_seqlens_q_padded=cu_seqlens_padded,
        cu_seqlens_kv_padded=cu_seqlens_padded,
        max_seqlen_q=max_seqlen,
        max_seqlen_kv=max_seqlen,
    )


class PackedMoEAttention(torch.nn.Module):
    """One MoE layer's graphed half on a rung: ``(hidden_states, rotary, cu_seqlens[, cu_seqlens_padded]) ->
    hidden_states`` after the attention and its residual add (:func:`bridge_cudagraph.host.compat.layer_attention`)."""

    def __init__(self, layer: torch.nn.Module, max_seqlen: int) -> None:
        super().__init__()
        self.layer = layer
        self.max_seqlen = max_seqlen

    def forward(self, hidden_states, rotary_pos_emb, cu_seqlens, *padded):
        params = packed_seq_params(cu_seqlens, padded[0] if padded else None, self.max_seqlen)
        return compat.layer_attention(self.layer, hidden_states, rotary_pos_emb, params)


class PaddedMoEAttention(torch.nn.Module):
    """One MoE layer's graphed half on the padded rung: ``(hidden_states, rotary) -> hidden_states`` after the
    attention and its residual add, with no attention mask (the layers are causal; a micro-batch whose layers would
    read a mask runs eagerly, :meth:`~bridge_cudagraph.capture.padded.PaddedLanguageGraphHelper.misfit`)."""

    def __init__(self, layer: torch.nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, hidden_states, rotary_pos_emb=None):
        return compat.layer_attention(self.layer, hidden_states, rotary_pos_emb, None)


def run_on_real_rows(
    step: Callable[[torch.Tensor], torch.Tensor], hidden_states: torch.Tensor, rows: int
) -> torch.Tensor:
    """``step`` on the first ``rows`` rows of ``hidden_states`` (``[B, 1, H]``), the rows after them carried on as
    they are: ``cat([step(h[:rows]), h[rows:]])``, so autograd sends each part's gradient back to its own rows."""
    if rows >= hidden_states.size(0):
        return step(hidden_states)
    return torch.cat([step(hidden_states[:rows]), hidden_states[rows:]])


class MoELayers:
    """The MoE layers of one decoder on the ladder: their graphed callables, the eager MLP half after each MoE
    layer's graph, and (packed) the tail tokens per rung kept out of them.

    Args:
        decoder: The decoder (``TransformerBlock``) whose layers are captured.
        segments: The layer ranges ``[start, end)`` of its graphs (the plan's); each MoE layer must be one of its own.
        stats: The helper's stats, whose :attr:`~bridge_cudagraph.capture.stats.CaptureStats.moe_tail_tokens` this
            counts into.

    Raises:
        CaptureError: An MoE layer that shares a graph with other layers, or whose MLP half cannot run after its
            graph (expert-parallel overlap splits the layer into callables of its own).
    """

    def __init__(self, decoder: Any, segments: Sequence[tuple[int, int]], stats: CaptureStats) -> None:
        self.stats = stats
        self.moe_layers = frozenset(i for i, layer in enumerate(decoder.layers) if is_moe_layer(layer))
        alone = {start for start, end in segments if end - start == 1}
        for index in sorted(self.moe_layers):
            if index not in alone:
                raise CaptureError(
                    f"language: MoE layer {index} shares a graph with other layers ({list(segments)}); MoE layers "
                    "need graph_unit 'layer' (the plan resolves it so)"
                )
            if getattr(decoder.layers[index].config, "overlap_moe_expert_parallel_comm", False):
                raise CaptureError(
                    f"language: MoE layer {index} cannot be captured: model.overlap_moe_expert_parallel_comm="
                    "true splits the layer into fine-grained callables of its own"
                )

    @classmethod
    def of(cls, decoders: Sequence[Any], segments: Sequence, stats: CaptureStats) -> MoELayers | None:
        """The MoE layers of the ladder's decoder (one model chunk per rank), or None for a dense model."""
        if not decoders or not any(is_moe_layer(layer) for layer in decoders[0].layers):
            return None
        return cls(decoders[0], segments[0], stats)

    # ------------------------------------------------------------------ capture
    @staticmethod
    def wrap(
        layer: torch.nn.Module,
        dense: Callable[[torch.nn.Module], torch.nn.Module],
        attention: Callable[[torch.nn.Module], torch.nn.Module],
    ) -> torch.nn.Module:
        """The graphed callable of one layer: ``attention(layer)`` (:class:`PackedMoEAttention` or
        :class:`PaddedMoEAttention`) for an MoE layer, ``dense(layer)`` (the whole layer) for a dense one."""
        return attention(layer) if is_moe_layer(layer) else dense(layer)

    # ------------------------------------------------------------------ replay
    @staticmethod
    def misfit(params: PackedSeqParams) -> tuple[str, str] | None:
        """Why a packed micro-batch cannot replay the MoE graphs, or None: a ``tokens_per_sample`` asks megatron-core
        to route each sample as its own row (``_maybe_unflatten_for_moe``), which the eager half does not do."""
        if getattr(params, "tokens_per_sample", None) is not None:
            return ("moe-rows", "packed_seq_params.tokens_per_sample is set (per-sample MoE routing)")
        return None

    def count_tail(self, *, budget: int, tokens: int) -> None:
        """A micro-batch of ``tokens`` replays at ``budget``: its tail ``budget - tokens`` is counted as kept out of
        the MoE layers at that rung."""
        tails = self.stats.moe_tail_tokens
        tails[budget] = tails.get(budget, 0) + budget - tokens

    def remainder(self, block: Any, end: int, outputs: torch.Tensor, rows: int) -> torch.Tensor:
        """After the graph of the segment that ends before layer ``end``: an MoE layer's eager MLP half on the
        micro-batch's ``rows`` local real rows (every row of a padded micro-batch; :func:`run_on_real_rows`); a dense
        segment's output unchanged. An MoE layer is a segment of its own (checked at construction), so the segment is
        layer ``end - 1`` alone."""
        index = end - 1
        if index not in self.moe_layers:
            return outputs
        layer = block.layers[index]
        return run_on_real_rows(lambda h: compat.layer_mlp(layer, h), outputs, rows)
