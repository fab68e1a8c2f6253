"""What the ladder's two language forms share: packed rows (:mod:`bridge_cudagraph.capture.packed`) and padded rows
(:mod:`bridge_cudagraph.capture.padded`) capture the same decoder layers in the same segments, replay through the same
decoder mixin (:mod:`bridge_cudagraph.capture.block_replay`), and keep their rungs, copies, pools, manual hooks and
fallback counts the same way; they differ in their static inputs and in how a micro-batch is fitted to a rung.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from bridge_cudagraph.capture.block_replay import (
    check_merges,
    deepstack_merge,
    install_ladder_replay,
    remove_ladder_replay,
    replay_segments,
)
from bridge_cudagraph.capture.budget_ladder import BudgetLadder
from bridge_cudagraph.capture.checks import CaptureError
from bridge_cudagraph.capture.graph_copies import GraphCopies
from bridge_cudagraph.capture.ladder_helper import LadderHelper
from bridge_cudagraph.capture.moe_layers import MoELayers
from bridge_cudagraph.capture.static_inputs import StaticBuffers
from bridge_cudagraph.capture.stats import CaptureStats
from bridge_cudagraph.host.compat import param_gather_hook_maker
from bridge_cudagraph.plan.budgets import language_segments

logger = logging.getLogger("bridge_cudagraph")

__all__ = ["LanguageLadder", "language_model_of"]


def language_model_of(chunk):
    """The module that owns the decoder, rotary embedding and position type: the chunk itself for GPT,
    ``chunk.language_model`` for Qwen3-VL (unwrapping DDP / Float16Module first)."""
    module = chunk
    while not hasattr(module, "decoder") and hasattr(module, "module"):
        module = module.module
    return getattr(module, "language_model", None) or module


class LanguageLadder(LadderHelper):
    """The language model's decoder layers on the ladder engine, one model chunk per rank.

    Subclasses provide ``_capture_rung(budget, copy, pool)`` and ``forward_block`` (the decoder mixin's question).

    Args:
        model: The DDP-wrapped model chunks.
        budgets: The ladder's possible rungs, in tokens.
        copies: Independent graph sets, one per micro-batch the schedule keeps in flight (1 without a pipeline).
        num_warmup_iters: TE warmup iterations per callable before capture.
        on_capture_error: ``"eager"`` or ``"raise"``.
        graph_unit: ``run`` (one graph per run of layers between deepstack merges) or ``layer``.
        deepstack_merges: Layers after which a first-stage decoder merges a deepstack feature (the plan's).
    """

    submodule = "language"
    tight = False
    form = ""
    """How this ladder's micro-batches reach the decoder, for the fallback log (``packed``, ``padded``)."""
    segment_remainder: Callable[[Any, int, torch.Tensor, int], torch.Tensor] | None = None
    """``(block, end, outputs, rows) -> hidden_states``: what runs eagerly right after the graph of the segment that
    ends before layer ``end``, on its output and the micro-batch's ``rows`` local real rows, before that segment's
    deepstack merge (an MoE layer's MLP half, :meth:`~bridge_cudagraph.capture.moe_layers.MoELayers.remainder`);
    None: the graph's output is the hidden states. :meth:`_replay_layers` composes it with the merge into the one
    ``after_segment`` of :func:`~bridge_cudagraph.capture.block_replay.replay_segments`."""

    if TYPE_CHECKING:  # a subclass provides it (above)

        def forward_block(
            self, block: Any, hidden_states: torch.Tensor, attention_mask: Any, kwargs: dict
        ) -> torch.Tensor | None: ...

    def __init__(
        self,
        model: Sequence[torch.nn.Module],
        *,
        budgets: Sequence[int],
        copies: int = 1,
        num_warmup_iters: int = 3,
        on_capture_error: str = "eager",
        graph_unit: str = "layer",
        deepstack_merges: int = 0,
    ) -> None:
        self.model = list(model)
        self.num_warmup_iters = num_warmup_iters
        self.on_capture_error = on_capture_error
        decoders = [getattr(language_model_of(chunk), "decoder", None) for chunk in self.model]
        self.decoders = [d for d in decoders if d is not None and len(d.layers)]
        if len(self.decoders) > 1:
            raise CaptureError("the language ladder supports one model chunk per rank (no virtual pipeline)")
        #: The layer ranges ``[start, end)`` each graph of a set spans, per decoder.
        self.segments = [
            language_segments(
                len(d.layers), deepstack_merges, first_stage=getattr(d, "pre_process", True), unit=graph_unit
            )
            for d in self.decoders
        ]
        self.copies = GraphCopies(int(copies))
        self.ladder = BudgetLadder(budgets)
        #: ``graphs[budget][copy]``.
        self.graphs: dict[int, list] = {}
        self._pools: list = []
        self._statics = [StaticBuffers() for _ in range(self.copies.count)]
        self._fused_grad_params: list[torch.nn.Parameter] = []
        self._manual_hooks = False
        self.stats = CaptureStats(self.submodule, layers=sum(len(d.layers) for d in self.decoders))
        self._warned: set[str] = set()
        for decoder in self.decoders:
            install_ladder_replay(decoder, self)
        #: The MoE layers' graphs and eager MLP halves (:mod:`bridge_cudagraph.capture.moe_layers`); None when dense.
        try:
            self.moe = MoELayers.of(self.decoders, self.segments, self.stats)
        except CaptureError:
            self.uninstall()  # the decoders get their own class back
            raise
        self.segment_remainder = None if self.moe is None else self.moe.remainder

    def _captured_layers(self) -> list:
        return list(self.decoders[0].layers) if self.decoders else []

    def _fallback(self, cause: str, detail: str) -> None:
        """A micro-batch runs eagerly: counted, logged once per cause."""
        self.stats.eager_fallbacks += 1
        if cause not in self._warned:
            self._warned.add(cause)
            logger.warning(
                "bridge_cudagraph: a %s language micro-batch runs eagerly (counted in stats): %s", self.form, detail
            )

    def _prepare_replay(self) -> None:
        """Before a rung's graphs replay: the parameters whose weight-gradient fusion the graphs do (see
        :meth:`~bridge_cudagraph.capture.vision.VisionGraphHelper.before_replay`)."""
        for param in self._fused_grad_params:
            param.grad_added_to_main_grad = True  # type: ignore[attr-defined]  # Megatron's flag on a Parameter

    def _replay_layers(self, block, layers, h, statics, *, visual, kwargs: dict, rows: int) -> torch.Tensor:
        """The decoder's layers on one rung's graphs (:func:`replay_segments`), with the micro-batch's deepstack
        merges where the first stage makes them, each after the segment's :attr:`segment_remainder` where there is
        one (``rows``: the micro-batch's local rows, the rest of ``h`` the rung's tail)."""
        deepstack = kwargs.get("deepstack_visual_embeds")
        merges = len(deepstack) if block.pre_process and deepstack is not None else 0
        segments = self.segments[self.decoders.index(block)]
        check_merges(merges, segments)
        merge = deepstack_merge(block, merges, visual, deepstack)
        remainder = self.segment_remainder
        if remainder is None:
            return replay_segments(block, layers, h, statics, segments, after_segment=merge)

        def after_segment(end: int, outputs) -> torch.Tensor:
            return merge(end, remainder(block, end, outputs, rows))

        return replay_segments(block, layers, h, statics, segments, after_segment=after_segment)

    def _finish(self, block, h: torch.Tensor) -> torch.Tensor:
        """What the host's block does after its layers: the final norm (last stage), a viewless output; counted."""
        from megatron.core.utils import make_viewless_tensor

        if block.final_layernorm is not None:
            h = block.final_layernorm(h)
        h = make_viewless_tensor(inp=h, requires_grad=True, keep_graph=True)
        self.stats.replays += 1
        return h

    # ------------------------------------------------------------------ lifecycle
    def _set_manual_hooks(self) -> None:
        for decoder in self.decoders:
            chunk = next(c for c in self.model if any(m is decoder for m in c.modules()))
            for layer in decoder.layers:
                layer.setup_manual_hooks(param_gather_hook_maker(chunk))

    def _hooked_layers(self) -> list:
        return [layer for decoder in self.decoders for layer in decoder.layers]

    def uninstall(self) -> None:
        """Delete the graphs and give the decoders their own class back."""
        self.delete_cuda_graphs()
        for decoder in self.decoders:
            remove_ladder_replay(decoder)
