"""Language graphs that replay padded (BSHD) micro-batches on the ladder engine, the engine of the packed and vision
graphs.

A run that pads every micro-batch to ``seq_length`` (Bridge's padded Qwen3-VL path, GPT SFT without packing, the
pipeline-parallel recipes) feeds the decoder one shape: ``(S/cp, mbs, H)`` hidden states and a rotary table. The
ladder holds one rung of that shape; each layer is captured as :class:`_PaddedLanguageLayer`, whose body is the layer's
own ``forward`` with the hidden states and the rotary table as its inputs (what megatron-core's per-layer capture
records, ``TransformerLayer._te_cuda_graph_capture``), and with ``graph_unit: run`` the layers between two
deepstack merges are one graph, as in the packed form. A copy per micro-batch a pipeline stage keeps in flight (one
without a pipeline), the rung's pool, the parameter gradients' summing graphs, the manual hooks and the decoder's
replay (:mod:`bridge_cudagraph.capture.block_replay`) are the ladder's (:mod:`bridge_cudagraph.capture.ladder_helper`).

An MoE layer is a graph of its own holding its attention (:class:`~bridge_cudagraph.capture.moe_layers.
PaddedMoEAttention`); its MLP half (router, dispatch, experts) runs eagerly after the graph on every row, as Bridge's
padded step routes them (:class:`~bridge_cudagraph.capture.moe_layers.MoELayers`), the form the packed MoE graphs have.

The attention mask is not a graph input: the layers are causal, and TE reads a mask only for padding or arbitrary
mask types (``DotProductAttention.forward``); a micro-batch whose layers would read one runs eagerly, counted, as does
one of another shape or with a rotary table of another shape.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from bridge_cudagraph.capture.checks import check_static_inputs
from bridge_cudagraph.capture.ladder_capture import ladder_order_kwargs
from bridge_cudagraph.capture.language_ladder import LanguageLadder
from bridge_cudagraph.capture.moe_layers import MoELayers, PaddedMoEAttention
from bridge_cudagraph.capture.segments import segment_callables
from bridge_cudagraph.capture.static_inputs import activation_dtype, rotary_dim, sequence_split

logger = logging.getLogger("bridge_cudagraph")

__all__ = ["PaddedLanguageGraphHelper"]


class _PaddedLanguageLayer(torch.nn.Module):
    """One decoder layer as a graphable callable: its own ``forward`` on the hidden states and the rotary table."""

    def __init__(self, layer: torch.nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, hidden_states, rotary_pos_emb=None):
        # layer.forward, not layer(...): megatron-core's routing in GraphableMegatronModule.__call__ would send a
        # training call to its own TE graph path.
        out, _ = self.layer.forward(hidden_states=hidden_states, attention_mask=None, rotary_pos_emb=rotary_pos_emb)
        return out


@dataclass
class PaddedGraphSet:
    """The rung's graphed layers of one decoder (one copy), and the rotary table every one of them reads (written
    once per replay: each layer's TE replay finds it in place)."""

    layers: list
    rotary: torch.Tensor | None
    """None for a model without rotary embeddings."""

    @property
    def statics(self) -> tuple[torch.Tensor, ...]:
        return () if self.rotary is None else (self.rotary,)


def _reads_mask(layer: torch.nn.Module) -> bool:
    """Whether TE's attention of ``layer`` reads an attention mask: padding or arbitrary mask types only."""
    attention = getattr(layer, "self_attention", None)
    kind = getattr(getattr(attention, "attn_mask_type", None), "name", "")
    return "padding" in kind or "arbitrary" in kind


class PaddedLanguageGraphHelper(LanguageLadder):
    """Captures the decoder layers once for padded micro-batches (one rung of ``rows x width`` tokens); replays them.

    Follows megatron-core's ``TECudaGraphHelper`` protocol (``create_cudagraphs``, ``graphs_created``,
    ``cuda_graph_set_manual_hooks``, ``delete_cuda_graphs``, ``stats``), so the one lifecycle owner drives it.

    Args:
        model: The DDP-wrapped model chunks.
        rows: Rows of a micro-batch (the micro-batch size).
        width: Tokens of a row the decoder sees (``seq_length / cp``).
        copies: Independent graph sets, one per micro-batch the schedule keeps in flight (1 without a pipeline).
        static_inputs: The plan's :class:`~bridge_cudagraph.plan.capture_plan.StaticInput` of every graph; capture
            checks its buffers against them.
        num_warmup_iters, on_capture_error, graph_unit, deepstack_merges: As
            :class:`~bridge_cudagraph.capture.language_ladder.LanguageLadder`.
    """

    form = "padded"

    def __init__(
        self,
        model: Sequence[torch.nn.Module],
        *,
        rows: int,
        width: int,
        copies: int = 1,
        static_inputs: Sequence = (),
        num_warmup_iters: int = 3,
        on_capture_error: str = "eager",
        graph_unit: str = "layer",
        deepstack_merges: int = 0,
    ) -> None:
        self.rows, self.width = int(rows), int(width)
        self.planned_inputs = tuple(static_inputs)
        super().__init__(
            model,
            budgets=(self.rows * self.width,),
            copies=copies,
            num_warmup_iters=num_warmup_iters,
            on_capture_error=on_capture_error,
            graph_unit=graph_unit,
            deepstack_merges=deepstack_merges,
        )
        self.budget = self.rows * self.width

    # ------------------------------------------------------------------ capture
    def _rotary_shape(self, decoder) -> tuple[int, ...] | None:
        """The rotary table the layers read: mRoPE's ``(S/cp, mbs, 1, d)`` (one row per token of each row), RoPE's
        ``(S/cp, 1, 1, d)`` (the same positions for every row), or None (no rotary embedding)."""
        from bridge_cudagraph.capture.language_ladder import language_model_of

        chunk = next(c for c in self.model if any(m is decoder for m in c.modules()))
        kind = getattr(language_model_of(chunk), "position_embedding_type", None)
        if kind not in ("rope", "mrope"):
            return None
        config = decoder.config
        return (self.width, self.rows if kind == "mrope" else 1, 1, rotary_dim(config))

    def _capture_rung(self, budget: int, copy: int, pool) -> PaddedGraphSet:
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker
        from transformer_engine.pytorch import make_graphed_callables

        decoder = self.decoders[0]
        config = decoder.config
        segments = self.segments[0]
        moe = self.moe
        callables = segment_callables(
            list(decoder.layers),
            segments,
            _PaddedLanguageLayer
            if moe is None
            else lambda layer: MoELayers.wrap(layer, _PaddedLanguageLayer, PaddedMoEAttention),
        )
        statics = self._statics[copy]
        tp = sequence_split(config)
        dtype = activation_dtype(config)
        rotary_shape = self._rotary_shape(decoder)
        rotary = None if rotary_shape is None else statics.view("rotary", rotary_shape, torch.float32)
        shape = (self.width // tp, self.rows, config.hidden_size)
        hidden = [statics.view(f"hidden_states.{i}", shape, dtype, requires_grad=True) for i in range(len(callables))]
        with torch.no_grad():  # warmup values only; every replay writes its own
            if rotary is not None:
                rotary.copy_(torch.randn_like(rotary))
            for h in hidden:
                h.copy_(torch.randn_like(h) * 0.02)
        tensors = {"hidden_states": hidden[0], **({} if rotary is None else {"rotary_pos_emb": rotary})}
        check_static_inputs(tensors, self.planned_inputs, "language")
        graph_set = PaddedGraphSet([], rotary)
        rng = get_cuda_rng_tracker().fork() if config.sequence_parallel else contextlib.nullcontext()
        with rng:
            graphed = make_graphed_callables(
                callables,
                tuple((h, *graph_set.statics) for h in hidden),
                num_warmup_iters=self.num_warmup_iters,
                allow_unused_input=True,
                pool=pool,
                **ladder_order_kwargs(len(callables)),
            )
        graph_set.layers = list(graphed)
        return graph_set

    # ------------------------------------------------------------------ replay
    def forward_block(self, block, hidden_states, attention_mask, kwargs: dict) -> torch.Tensor | None:
        """A plain training call of the decoder with padded rows: replayed, or None (the host's forward runs):
        packed, before capture, or a micro-batch that does not fit (counted)."""
        if kwargs.get("packed_seq_params") is not None or not self.graphs_created():
            return None
        if not block.pre_process:
            hidden_states = block.input_tensor  # as the host's forward does (set_input_tensor)
        misfit = self.misfit(block, hidden_states, attention_mask, kwargs.get("rotary_pos_emb"))
        copy = None if misfit else self.copies.acquire()
        if misfit is None and copy is None:
            misfit = ("copy", f"all {self.copies.count} padded graph copies are in flight")
        if misfit is not None:
            self._fallback(*misfit)
            return None
        from megatron.core.utils import make_viewless_tensor

        assert copy is not None  # a micro-batch without a copy misfits (above)
        graphs = self.graphs[self.budget][copy]
        if graphs.rotary is not None:
            graphs.rotary.copy_(kwargs["rotary_pos_emb"])
        self._prepare_replay()
        h = make_viewless_tensor(inp=hidden_states, requires_grad=True, keep_graph=True)
        visual = kwargs.get("visual_pos_masks")
        h = self._replay_layers(block, graphs.layers, h, graphs.statics, visual=visual, kwargs=kwargs, rows=h.size(0))
        self.copies.release_after_backward(copy, h)
        return self._finish(block, h)

    def misfit(self, block, hidden_states, attention_mask, rotary) -> tuple[str, str] | None:
        """Why a padded micro-batch cannot replay, as ``(cause, detail)``, or None: the captured hidden-state shape,
        a rotary table of the captured shape, and no attention mask the layers would read."""
        config = block.config
        tp = sequence_split(config)
        expected = (self.width // tp, self.rows, config.hidden_size)
        if tuple(hidden_states.shape) != expected:
            return (
                "shape",
                f"its hidden states {tuple(hidden_states.shape)} are not the captured {expected} (micro-batch size "
                "or sequence length other than the plan's)",
            )
        static = self.graphs[self.budget][0].rotary
        shape, captured = (None if t is None else tuple(t.shape) for t in (rotary, static))
        if shape != captured:
            return ("rotary", f"its rotary table {shape} is not the captured {captured}")
        if attention_mask is not None and _reads_mask(block.layers[0]):
            return ("mask", "its layers read an attention mask (a padding or arbitrary mask type)")
        return None
