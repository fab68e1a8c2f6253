"""Language graphs that replay packed (THD) micro-batches, as Bridge's Qwen3-VL fine-tuning and GPT SFT offline
packing feed them.

megatron-core 0.19.2's TE replay asserts ``packed_seq_params is None`` (``transformer_layer.py``
``_te_cuda_graph_replay``), so upstream's graphs demand every micro-batch padded to ``seq_length``. Bridge's Qwen3-VL
recipes pack instead (``enable_in_batch_packing`` with the packing done in ``qwen3_vl_step``): a micro-batch of ``b``
rows reaches the decoder as one THD sequence of ``b x L`` tokens (``L`` the batch's longest row, rounded up to 16), one
attention segment per row, ``cu_seqlens_q`` and a separate ``cu_seqlens_q_padded`` of equal values. ``L`` varies per
micro-batch, so the static shapes come from a **token budget ladder**, the scheme the vision graphs use:

* the decoder's input (``T`` tokens) is padded to the smallest captured budget ``B >= T``;
* the static ``cu_seqlens`` lists the micro-batch's own boundaries (a device-to-device copy, no wait), then
  the unused tail ``[T, B)`` as segments of its own, each at most ``max_seqlen`` long (the static ``max_seqlen``
  is the longest real segment allowed, not the budget: under ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0`` TE picks
  its backend by it, :mod:`bridge_cudagraph.plan.determinism`), then zero-length segments up
  to the captured length. No real token attends to the tail, and the tail rows are dropped before the final
  norm, so they add nothing to the loss;
* the mRoPE embedding ``(T, 1, 1, rotary_dim)`` is a static input (zeros on the tail); the deepstack features
  are added eagerly between the graphed layers at the same rows as in eager mode (``visual_pos_masks`` padded
  with False), with Bridge's own ``_deepstack_process``;
* each layer is captured as :class:`_PackedLanguageLayer`, whose inputs are tensors only and which rebuilds the
  ``PackedSeqParams`` inside from the static ``cu_seqlens`` (the approach of Megatron-LM dev #4359, kept in our
  capture path instead of changing megatron-core's layer); with ``graph_unit: run`` (the default) the layers
  between two deepstack merges are one graph (:class:`~bridge_cudagraph.capture.segments.LayerChain`), so a budget
  holds 4 graphs on Qwen3-VL's first stage instead of one per layer.

TE picks the attention backend from whether ``cu_seqlens_q_padded`` *is* ``cu_seqlens_q`` (``pad_between_seqs``
auto-detection, ``dot_product_attention.py``); the graphs are captured in the form the data path uses
(``separate_padded``) and a micro-batch in the other form runs eagerly, so replay never changes the backend.

GPT SFT offline packing (Bridge's ``GPTSFTPackedDataset``, ``gpt_step``) hands one row of ``seq_length`` tokens per
micro-batch, its boundaries padded to one length (``pad_cu_seqlens``), and no ``cu_seqlens_q_padded`` unless samples
are padded to a multiple: one budget of ``seq_length``, captured without the separate padded copy where the data has
none; its RoPE table has a row per position within a sequence (fewer rows than the budget, the rest zeros) and TE's
fused THD kernel reads it by position (:func:`bridge_cudagraph.plan.checks.check_offline_packing`).

The replay is the decoder's forward (:mod:`bridge_cudagraph.capture.block_replay`, shared with the padded rows'
graphs): a training micro-batch that is packed and fits replays the graphs, and any other call is the host's
``forward`` unchanged. A micro-batch over the largest budget, with more
sequences than ``max_sequences``, or with a segment longer than ``max_seqlen`` runs eagerly, counted and logged
once.

**Tight packing** (:mod:`bridge_cudagraph.capture.tight`, the plan's ``tight``): on Bridge's Qwen3-VL rows form at
pipeline parallel 1 without sequence parallelism, the replay keeps of each row only its needed prefix (rounded to 16)
before the layers and puts the output back at the full layout's rows before the final norm, so the graphs run on
``T' = sum(round_up(extent, 16))`` tokens at the smallest budget that holds ``T'``, and the ladder observes ``T'``.
The rows' extents come from the CPU copies :mod:`bridge_cudagraph.host.rope_index` makes, through the forward step's
:class:`~bridge_cudagraph.micro_batch.MicroBatch`; where they are unknown, or anything else differs, the micro-batch
takes the path above unchanged.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from megatron.core.packed_seq_params import PackedSeqParams

from bridge_cudagraph.capture.checks import CaptureError, check_static_inputs
from bridge_cudagraph.capture.ladder_capture import ladder_order_kwargs
from bridge_cudagraph.capture.language_ladder import LanguageLadder
from bridge_cudagraph.capture.moe_layers import MoELayers, PackedMoEAttention
from bridge_cudagraph.capture.segments import segment_callables
from bridge_cudagraph.capture.static_inputs import StaticBuffers, activation_dtype, rotary_dim, sequence_split
from bridge_cudagraph.capture.tight import TightRows, gather_rows, scatter_rows, tight_rows
from bridge_cudagraph.micro_batch import current_micro_batch
from bridge_cudagraph.plan.budgets import PackedLayout

logger = logging.getLogger("bridge_cudagraph")


# ---------------------------------------------------------------------------------------- callables
class _PackedLanguageLayer(torch.nn.Module):
    """One decoder layer as a graphable callable with tensor-only inputs; the ``PackedSeqParams`` is rebuilt
    inside from the static ``cu_seqlens`` (and a separate padded copy when the data path has one)."""

    def __init__(self, layer: torch.nn.Module, max_seqlen: int) -> None:
        super().__init__()
        self.layer = layer
        self.max_seqlen = max_seqlen

    def forward(self, hidden_states, rotary_pos_emb, cu_seqlens, cu_seqlens_padded=None):
        padded = cu_seqlens if cu_seqlens_padded is None else cu_seqlens_padded
        params = PackedSeqParams(
            qkv_format="thd",
            cu_seqlens_q=cu_seqlens,
            cu_seqlens_kv=cu_seqlens,
            cu_seqlens_q_padded=None if cu_seqlens_padded is None else padded,
            cu_seqlens_kv_padded=None if cu_seqlens_padded is None else padded,
            max_seqlen_q=self.max_seqlen,
            max_seqlen_kv=self.max_seqlen,
        )
        # layer.forward, not layer(...): megatron-core's routing in GraphableMegatronModule.__call__ would send a
        # training call to its own (BSHD) TE graph path, whose replay refuses packed_seq_params.
        out, _ = self.layer.forward(
            hidden_states=hidden_states, attention_mask=None, rotary_pos_emb=rotary_pos_emb, packed_seq_params=params
        )
        return out


@dataclass
class PackedGraphSet:
    """One budget's graphed layers of one decoder (one copy), and the static inputs all of them read.

    The rotary table and the ``cu_seqlens`` are the tensors the layers were captured with: a replay writes them
    once, and each layer's TE replay finds its static input already in place and copies nothing.
    """

    layers: list
    """The graphed callables, one per segment of layers."""
    rotary: torch.Tensor
    cu_seqlens: torch.Tensor
    cu_seqlens_padded: torch.Tensor | None

    @property
    def budget(self) -> int:
        return self.rotary.size(0)

    def load(
        self,
        layout: PackedLayout,
        rotary: torch.Tensor,
        params: PackedSeqParams,
        tokens: int,
        cu_seqlens: Sequence[int] | None = None,
    ) -> None:
        """Write a micro-batch's rotary rows (zeros after) and its ``cu_seqlens`` into the static inputs.

        ``tokens`` is the micro-batch's token count (a shape, known on the CPU). The real boundaries are copied
        device to device; the tail's boundaries depend only on ``tokens`` and are written relative to the real
        last boundary (a device add), so nothing waits for the GPU. With padding between sequences the unpadded
        ``cu_seqlens`` ends below ``tokens``; its tail segments get the same lengths as the padded ones.

        ``cu_seqlens`` (CPU, ``[0, ..., tokens]``): the boundaries of tightly packed rows, written into both static
        copies instead of ``params``' (equal values, as the Qwen3-VL step's are).
        """
        rows = rotary.size(0)
        self.rotary[:rows].copy_(rotary)
        self.rotary[rows:].zero_()
        if cu_seqlens is not None:
            cpu = torch.tensor(layout.static_cu_seqlens(cu_seqlens, self.budget), dtype=self.cu_seqlens.dtype)
            cpu = cpu.pin_memory() if torch.cuda.is_available() else cpu
            for static in (self.cu_seqlens, self.cu_seqlens_padded):
                if static is not None:
                    static.copy_(cpu, non_blocking=True)
            return
        tail = layout.tail(tokens, self.budget)
        pairs = ((self.cu_seqlens, params.cu_seqlens_q), (self.cu_seqlens_padded, params.cu_seqlens_q_padded))
        for static, real in pairs:
            if static is None:
                continue
            n = real.numel()
            rest = [end - tokens for end in tail] + [self.budget - tokens] * (static.numel() - n - len(tail))
            cpu = torch.tensor(rest, dtype=static.dtype)
            static[:n].copy_(real, non_blocking=True)
            static[n:].copy_(cpu.pin_memory() if torch.cuda.is_available() else cpu, non_blocking=True)
            static[n:].add_(real[-1:])


# ------------------------------------------------------------------------------------------- replay
def packed_misfit(
    layout: PackedLayout,
    budget: int | None,
    *,
    captured_top: int | None,
    holds: bool,
    tokens: int,
    sequences: int,
    form_matches: bool,
    max_seqlen: int,
    width: int,
    rotary_shape: tuple[int, ...] | None,
    tp: int,
) -> tuple[str, str] | None:
    """Why a packed micro-batch cannot replay, as ``(cause, detail)``, or None when it fits a captured graph.

    The causes, each counted and logged once by the helper: ``size`` (no budget holds it), ``above`` (its budget is
    above the captured top; it asks for its rung), ``form`` (its ``cu_seqlens_q_padded`` form is not the captured
    one), ``seqlen`` (a segment longer than ``max_seqlen``, or a batch dimension other than 1), ``rotary`` (its
    rotary table does not fit the static one), ``split`` (under sequence parallelism, ``tp`` > 1, a micro-batch
    narrower than its budget: each rank would pad its own slice of the rows at its end, so the sequence the
    attention gathers interleaves padding between the ranks' tokens, where the static ``cu_seqlens`` and rotary rows
    hold the real tokens first and the tail after them; the plan refuses such runs, this keeps a bypassed plan
    exact).
    """
    if budget is None:
        return (
            "size",
            f"{tokens} tokens in {sequences} sequences exceed the packed graphs (largest budget "
            f"{layout.budgets[-1]} tokens, at most {layout.max_sequences} sequences); raise "
            "model.cuda_graph.language.token_budgets / max_sequences to graph such batches",
        )
    if not holds:
        return (
            "above",
            f"{tokens} tokens need budget {budget}, above the captured top {captured_top} (chosen from the "
            "micro-batches before capture); it is captured before the next step where memory allows",
        )
    if not form_matches:
        return (
            "form",
            "its cu_seqlens_q_padded form differs from the captured one (the attention backend could change)",
        )
    if max_seqlen > layout.max_seqlen or width != 1:
        return ("seqlen", f"a segment of {max_seqlen} tokens exceeds max_seqlen {layout.max_seqlen}")
    # mRoPE (Qwen3-VL) has one row per token; RoPE one per position within a segment (<= the longest).
    if rotary_shape is None or rotary_shape[0] > budget or rotary_shape[1:3] != (1, 1) or budget % tp:
        return (
            "rotary",
            f"its rotary table {rotary_shape} does not fit the static ({budget}, 1, 1, d) one",
        )
    if tp > 1 and tokens != budget:
        return (
            "split",
            f"{tokens} tokens under sequence parallelism over tp {tp} are narrower than budget {budget}: each rank "
            "would pad its own slice, which the static cu_seqlens do not describe",
        )
    return None


def _device_indices(tight: TightRows, device) -> tuple[torch.Tensor, torch.Tensor]:
    """:class:`TightRows`' gather and scatter indices on ``device``, built on the CPU and copied from pinned memory
    without a wait (as :meth:`PackedGraphSet.load` copies ``cu_seqlens``)."""
    out = []
    for cpu in (tight.gather_index(), tight.scatter_index()):
        if torch.device(device).type == "cuda":
            cpu = cpu.pin_memory()
        out.append(cpu.to(device, non_blocking=True))
    return out[0], out[1]


# ------------------------------------------------------------------------------------------- helper
class PackedLanguageGraphHelper(LanguageLadder):
    """Captures the decoder layers once per token budget for packed micro-batches, and replays them.

    Follows megatron-core's ``TECudaGraphHelper`` protocol (``create_cudagraphs``, ``graphs_created``,
    ``cuda_graph_set_manual_hooks``, ``delete_cuda_graphs``, ``stats``), so the one lifecycle owner drives it.

    Args:
        model: The DDP-wrapped model chunks.
        layout: Budgets, sequence cap and ``max_seqlen`` (from the plan): the ladder's possible rungs; the captured
            ones follow the data (:class:`~bridge_cudagraph.capture.budget_ladder.BudgetLadder`).
        separate_padded: Capture with a ``cu_seqlens_q_padded`` that is a tensor of its own (Bridge's Qwen3-VL
            step) rather than none (or the same object).
        copies: Independent graph sets, one per micro-batch the schedule keeps in flight (1 without a pipeline).
        static_inputs: ``{budget: StaticInput...}`` from the plan; capture checks its buffers against them.
        num_warmup_iters: TE warmup iterations per callable before capture.
        on_capture_error: ``"eager"`` or ``"raise"``.
        graph_unit: ``run`` (one graph per run of layers between deepstack merges) or ``layer``.
        deepstack_merges: Layers after which a first-stage decoder merges a deepstack feature (the plan's).
        tight: Tight packing (the plan's; :mod:`bridge_cudagraph.capture.tight`): replay each row's needed prefix
            only, where :meth:`tight_rows` finds it safe.
    """

    form = "packed"

    def __init__(
        self,
        model: Sequence[torch.nn.Module],
        *,
        layout: PackedLayout,
        separate_padded: bool = True,
        copies: int = 1,
        static_inputs: dict | None = None,
        num_warmup_iters: int = 3,
        on_capture_error: str = "eager",
        graph_unit: str = "layer",
        deepstack_merges: int = 0,
        tight: bool = False,
    ) -> None:
        self.tight = bool(tight)
        self.layout = layout
        self.separate_padded = separate_padded
        self.planned_inputs = {int(b): tuple(v) for b, v in (static_inputs or {}).items()}
        if self.planned_inputs and tuple(sorted(self.planned_inputs)) != tuple(layout.budgets):
            raise CaptureError(
                f"language: the plan's static inputs are for budgets {sorted(self.planned_inputs)}, "
                f"not {list(layout.budgets)}"
            )
        #: Replays on tightly packed rows, and the tokens they dropped (what a test asserts is > 0).
        self.tight_replays = 0
        self.tight_dropped_tokens = 0
        super().__init__(
            model,
            budgets=layout.budgets,
            copies=copies,
            num_warmup_iters=num_warmup_iters,
            on_capture_error=on_capture_error,
            graph_unit=graph_unit,
            deepstack_merges=deepstack_merges,
        )
        if self.moe is not None and self.tight:
            # Tightly packed rows are not Bridge's rows: the MoE layers' eager MLP halves would route other rows than
            # Bridge's router sees. The plan never asks for it (tight packing is off on MoE models).
            self.uninstall()  # the decoders get their own class back
            raise CaptureError(
                "tight packing on a model with MoE layers: set model.cuda_graph.language."
                "tight_packing=false (the MoE layers' eager halves must run on Bridge's rows)"
            )

    # ------------------------------------------------------------------ capture
    def forward_block(self, block, hidden_states, attention_mask, kwargs: dict) -> torch.Tensor | None:
        """A plain training call of the decoder (:class:`~bridge_cudagraph.capture.block_replay.LadderReplayBlock`):
        a packed micro-batch replays, or before capture tells the ladder its size; None: the host's forward runs."""
        params = kwargs.get("packed_seq_params")
        if params is None or getattr(params, "qkv_format", None) != "thd":
            return None
        if not self.graphs_created():  # before capture: the ladder's top follows what the data shows
            self.observe(block, hidden_states, params)
            return None
        return self.replay(block, hidden_states, params, kwargs)

    def observe(self, block, hidden_states, params: PackedSeqParams | None = None) -> None:
        """A packed training micro-batch ran eagerly before capture: its token count (a shape; ``T'`` where it would
        replay tightly packed) tells the ladder."""
        tight = self.tight_rows(block, hidden_states, params)
        if tight is not None:
            self.ladder.observe(tight.tokens)
            return
        config = block.config
        tp = sequence_split(config)
        self.ladder.observe(hidden_states.size(0) * tp)

    def tight_rows(self, block, hidden_states, params: PackedSeqParams | None) -> TightRows | None:
        """The micro-batch's rows tightly packed (:mod:`bridge_cudagraph.capture.tight`), or None: today's path.

        Only where it cannot change a kept token's arithmetic and everything is known on the CPU: the plan's
        ``tight``, one pipeline stage (the block both embeds and norms), no sequence parallelism, no multi-token
        prediction, Bridge's Qwen3-VL rows form in the form captured (``B`` segments of the full width ``L``, a
        separate padded copy), and the rows' extents in the micro-batch for this very ``packed_seq_params``
        (:meth:`bridge_cudagraph.micro_batch.MicroBatch.row_extents_for`).
        """
        if not self.tight or params is None or not self.separate_padded:
            return None
        config = block.config
        if config.sequence_parallel or getattr(config, "mtp_num_layers", None):
            return None
        if not (getattr(block, "pre_process", True) and getattr(block, "post_process", True)):
            return None
        padded = params.cu_seqlens_q_padded
        if padded is None or padded is params.cu_seqlens_q or hidden_states.dim() != 3 or hidden_states.size(1) != 1:
            return None
        micro_batch = current_micro_batch()
        extents = None if micro_batch is None else micro_batch.row_extents_for(params)
        rows, tokens = (len(extents) if extents else 0), hidden_states.size(0)
        if not rows or params.cu_seqlens_q.numel() != rows + 1 or tokens % rows:
            return None
        assert extents is not None  # rows > 0
        width = tokens // rows
        if params.max_seqlen_q != width or max(extents) > width:
            return None
        return tight_rows(extents, width)

    def _sample_inputs(self, decoder, budget: int, graphs: int, statics: StaticBuffers):
        config = decoder.config
        dtype = activation_dtype(config)
        tp = sequence_split(config)
        rows = budget // tp
        rotary = statics.view("rotary", (budget, 1, 1, rotary_dim(config)), torch.float32)
        hidden = [
            statics.view(f"hidden_states.{i}", (rows, 1, config.hidden_size), dtype, requires_grad=True)
            for i in range(graphs)
        ]
        with torch.no_grad():  # warmup values only; every replay writes its own
            rotary.copy_(torch.randn_like(rotary))
            for h in hidden:
                h.copy_(torch.randn_like(h) * 0.02)
        real = [0, budget // 2, budget] if budget >= 2 else [0, budget]
        cu_host = torch.tensor(self.layout.static_cu_seqlens(real, budget), dtype=torch.int32)
        device = torch.cuda.current_device()
        cu = cu_host.to(device)
        cu_padded = cu_host.to(device) if self.separate_padded else None
        return hidden, rotary, cu, cu_padded

    def _capture_budget(self, decoder, budget: int, copy: int, pool) -> PackedGraphSet:
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker
        from transformer_engine.pytorch import make_graphed_callables

        max_seqlen = self.layout.max_seqlen
        segments = self.segments[self.decoders.index(decoder)]

        def wrap(layer):
            return _PackedLanguageLayer(layer, max_seqlen)

        moe = self.moe

        def wrap_moe(layer):
            return MoELayers.wrap(layer, wrap, lambda m: PackedMoEAttention(m, max_seqlen))

        callables = segment_callables(list(decoder.layers), segments, wrap if moe is None else wrap_moe)
        hidden, rotary, cu, cu_padded = self._sample_inputs(decoder, budget, len(callables), self._statics[copy])
        tensors = {"hidden_states": hidden[0], "rotary_pos_emb": rotary, "cu_seqlens": cu}
        if cu_padded is not None:
            tensors["cu_seqlens_padded"] = cu_padded
        check_static_inputs(tensors, self.planned_inputs.get(budget, ()), self.submodule)
        statics = (rotary, cu) if cu_padded is None else (rotary, cu, cu_padded)
        rng = get_cuda_rng_tracker().fork() if decoder.config.sequence_parallel else contextlib.nullcontext()
        with rng:
            graphed = make_graphed_callables(
                callables,
                tuple((h, *statics) for h in hidden),
                num_warmup_iters=self.num_warmup_iters,
                allow_unused_input=True,
                pool=pool,
                **ladder_order_kwargs(len(callables)),
            )
        return PackedGraphSet(list(graphed), rotary, cu, cu_padded)

    def _capture_rung(self, budget: int, copy: int, pool) -> PackedGraphSet:
        return self._capture_budget(self.decoders[0], budget, copy, pool)

    # ------------------------------------------------------------------ replay
    def _admit(
        self, hidden_states, params: PackedSeqParams, rotary_shape, *, tokens: int, tp: int
    ) -> tuple[int, int] | None:
        """The budget and the graph copy a micro-batch of ``tokens`` replays in, or None: it misses the graphs
        (:func:`packed_misfit`; a budget above the captured top asks for its rung) or every copy is in flight; counted
        and logged once per cause."""
        sequences = params.cu_seqlens_q.numel() - 1
        has_padded = params.cu_seqlens_q_padded is not None and params.cu_seqlens_q_padded is not params.cu_seqlens_q
        budget = self.layout.budget_for(tokens, sequences)
        fallback = packed_misfit(
            self.layout,
            budget,
            captured_top=self.ladder.top,
            holds=budget is not None and self.ladder.holds(budget),
            tokens=tokens,
            sequences=sequences,
            form_matches=has_padded == self.separate_padded,
            max_seqlen=params.max_seqlen_q or 0,
            width=hidden_states.size(1),
            rotary_shape=rotary_shape,
            tp=tp,
        )
        if fallback is not None and fallback[0] == "above":
            assert budget is not None  # no budget is the "size" fallback
            self.ladder.want(budget)
            self.stats.above_captured += 1
        copy = None if fallback else self.copies.acquire()
        if fallback is None and copy is None:
            fallback = ("copy", f"all {self.copies.count} packed graph copies are in flight")
        if fallback is not None:
            self._fallback(*fallback)
            return None
        assert budget is not None and copy is not None  # both, where nothing fell back (above)
        return budget, copy

    def replay(self, block, hidden_states, params: PackedSeqParams, kwargs: dict) -> torch.Tensor | None:
        """The decoder's forward on the graphs: pad to the budget, replay layer by layer (deepstack eagerly
        between them, as Bridge's block does), drop the tail (with tight packing: back at the full rows), final
        norm. None when the micro-batch does not fit (counted, logged once per cause): the caller then runs the
        host's forward."""
        from megatron.core.utils import make_viewless_tensor

        if not block.pre_process:
            hidden_states = block.input_tensor  # as the host's forward does (set_input_tensor)
        config = block.config
        tp = sequence_split(config)
        tokens = hidden_states.size(0) * tp
        rotary = kwargs.get("rotary_pos_emb")
        visual = kwargs.get("visual_pos_masks")
        rotary_shape = None if rotary is None else tuple(rotary.shape)
        moe_misfit = None if self.moe is None else self.moe.misfit(params)
        if moe_misfit is not None:
            self._fallback(*moe_misfit)
            return None
        tight = self.tight_rows(block, hidden_states, params)
        if tight is not None:
            if rotary_shape is not None and rotary_shape[0] == tokens:  # mRoPE: one row per token, kept ones only
                rotary_shape = (tight.tokens, *rotary_shape[1:])
            tokens = tight.tokens
        admitted = self._admit(hidden_states, params, rotary_shape, tokens=tokens, tp=tp)
        if admitted is None:
            return None
        budget, copy = admitted
        graphs = self.graphs[budget][copy]
        if tight is not None:
            gather, scatter = _device_indices(tight, hidden_states.device)
            hidden_states = gather_rows(hidden_states, gather, scatter)
            assert rotary is not None  # tight rows index the rotary table (Qwen3-VL's mRoPE passes one)
            rotary = rotary.index_select(0, gather)
            if visual is not None:
                visual = visual.index_select(-1, gather)
            graphs.load(self.layout, rotary, params, tokens, cu_seqlens=tight.cu_seqlens)
        else:
            graphs.load(self.layout, rotary, params, tokens)
        self._prepare_replay()
        rows = tokens // tp
        h = F.pad(hidden_states, (0, 0, 0, 0, 0, budget // tp - rows))
        h = make_viewless_tensor(inp=h, requires_grad=True, keep_graph=True)
        if visual is not None:  # [1, rows]: the local rows under sequence parallelism (split_deepstack_embs)
            visual = F.pad(visual, (0, budget // tp - visual.size(-1)), value=False)
        statics = (graphs.rotary, graphs.cu_seqlens) + (
            () if graphs.cu_seqlens_padded is None else (graphs.cu_seqlens_padded,)
        )
        if self.moe is not None:  # MoE: the rung's tail kept out of the MoE layers' eager halves
            self.moe.count_tail(budget=budget, tokens=tokens)
        h = self._replay_layers(block, graphs.layers, h, statics, visual=visual, kwargs=kwargs, rows=rows)
        self.copies.release_after_backward(copy, h)
        h = h[:rows]
        if tight is not None:  # back at the full layout's rows, the dropped ones zeros
            h = scatter_rows(h, gather, scatter)
            self.tight_replays += 1
            self.tight_dropped_tokens += tight.full_tokens - tight.tokens
        # The final norm after the scatter, on the host's rows: its weight gradient then sums over the rows Bridge's
        # does, in the same places (a dropped row adds an exact zero, as Bridge's, whose loss mask is zero there).
        # On the kept rows alone the sum is grouped differently and can differ from Bridge's in its last bits.
        return self._finish(block, h)
