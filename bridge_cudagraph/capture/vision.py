"""Vision-encoder capture that keeps eager semantics, with token-budget buckets and an eager fallback.

Upstream's vision graphs (Bridge ``vision_model.py``) pad every micro-batch to one length, drop the per-image
``cu_seqlens`` and pass a padding mask that the encoder's ``no_mask`` attention ignores: images attend to each
other and to padding, from step 0 (max abs per-token-loss difference 0.06 on a tiny model, DESIGN.md).

Here the vision layers are captured in Qwen3-VL's own eager format - packed THD attention - with the per-image
boundaries as a *static tensor input*, one graph per run of layers that ends at a deepstack layer (``graph_unit:
run``, :func:`~bridge_cudagraph.plan.budgets.layer_segments`) or per layer:

* the patches of a micro-batch (``N``) are padded to the smallest captured budget ``B >= N`` (in patches, the
  unit the layers run on);
* ``cu_seqlens`` lists every image frame (as ``build_packed_seq_params`` does), then one segment for the padding
  ``[N, B)``, then zero-length segments up to the captured length ``max_segments + 2`` - the layout Bridge's own
  packed-sequence graphs use (``data/packing/gpt_sft.py``, ``pad_cu_seqlens``): images attend only to
  themselves and never to padding;
* the 2-D rotary embedding is a static input (zeros on padding);
* deepstack mergers and the final merger run eagerly on the unpadded rows, exactly as in eager mode.

A micro-batch larger than the largest budget, or with more frames than ``max_segments``, runs eagerly and is
counted (:attr:`CaptureStats.eager_fallbacks`), logged once. The budgets share their memory: only one budget
runs per micro-batch (:func:`~bridge_cudagraph.capture.ladder_capture.capture_budget_ladder`). The captured rungs
follow the data: those up to the largest micro-batch of the warmup steps, more when a later micro-batch needs them
(:class:`~bridge_cudagraph.capture.budget_ladder.BudgetLadder`).

Under a pipelined language model the first stage holds several micro-batches between forward and backward (1F1B), so
the graphs are captured in ``copies`` independent sets (:func:`~bridge_cudagraph.plan.budgets.in_flight_microbatches`):
a forward takes a free set and the set is free again once that micro-batch's backward has reached it. The schedule's
order needs no capture-time ``_order``: whichever order the schedule runs, a micro-batch's forward and backward replay
the same set, and no set is shared by two micro-batches in flight. A micro-batch that finds no free set runs eagerly
and is counted, never corrupts another's activations.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from megatron.core.packed_seq_params import PackedSeqParams

from bridge_cudagraph.capture.block_replay import replay_segments
from bridge_cudagraph.capture.budget_ladder import BudgetLadder
from bridge_cudagraph.capture.checks import CaptureError, check_static_inputs
from bridge_cudagraph.capture.graph_copies import GraphCopies
from bridge_cudagraph.capture.ladder_capture import ladder_order_kwargs
from bridge_cudagraph.capture.ladder_helper import LadderHelper
from bridge_cudagraph.capture.segments import segment_callables
from bridge_cudagraph.capture.static_inputs import StaticBuffers
from bridge_cudagraph.capture.stats import CaptureStats
from bridge_cudagraph.config import GRAPH_UNITS
from bridge_cudagraph.host.compat import param_gather_hook_maker
from bridge_cudagraph.micro_batch import current_micro_batch
from bridge_cudagraph.plan.budgets import PackedLayout, layer_segments
from bridge_cudagraph.vision.encoder import GraphedQwen3VLVisionModel, frame_seqlens
from bridge_cudagraph.vision.positions import rotary_input

if TYPE_CHECKING:
    from bridge_cudagraph.plan.capture_plan import StaticInput

logger = logging.getLogger("bridge_cudagraph")


def padded_cu_seqlens(seqlens: torch.Tensor, budget: int, layout: PackedLayout) -> torch.Tensor:
    """The static ``cu_seqlens`` (int32, on the CPU) of a micro-batch whose frames have ``seqlens`` patches:
    its own boundaries, then the padding ``[N, B)`` as segments of at most ``layout.max_seqlen``, then
    zero-length segments (:meth:`~bridge_cudagraph.plan.budgets.PackedLayout.static_cu_seqlens`, the layout the
    packed language graphs use too). Real patches never attend to the padding."""
    real = [0, *seqlens.cumsum(0).tolist()]
    return torch.tensor(layout.static_cu_seqlens(real, budget), dtype=torch.int32)


class _PackedVisionLayer(torch.nn.Module):
    """One vision layer as a graphable callable with tensor-only inputs: the packed-attention metadata is
    rebuilt inside from the static ``cu_seqlens`` and the static ``max_seqlen``: the longest frame that replays,
    not the budget, which keeps TE's fused backend under ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0``
    (:func:`bridge_cudagraph.plan.determinism.deterministic_max_seqlen`)."""

    def __init__(self, layer: torch.nn.Module, max_seqlen: int) -> None:
        super().__init__()
        self.layer = layer
        self.max_seqlen = max_seqlen

    def forward(self, hidden_states: torch.Tensor, rotary_pos_emb: torch.Tensor, cu_seqlens: torch.Tensor):
        params = PackedSeqParams(
            qkv_format="thd",
            cu_seqlens_q=cu_seqlens,
            cu_seqlens_kv=cu_seqlens,
            max_seqlen_q=self.max_seqlen,
            max_seqlen_kv=self.max_seqlen,
        )
        # layer.forward, not layer(...): megatron-core's TE-graph routing in GraphableMegatronModule.__call__
        # must not see these layers (their config keeps cuda_graph_impl="none").
        out, _ = self.layer.forward(
            hidden_states=hidden_states, attention_mask=None, rotary_pos_emb=rotary_pos_emb, packed_seq_params=params
        )
        return out


@dataclass
class GraphSet:
    """One budget's graphed layers (one copy) and the static inputs every layer of it reads.

    ``rotary`` and ``cu_seqlens`` are the very tensors the layers were captured with, shared by all layers:
    a replay writes them once and passes them to each layer, whose TE replay then finds its static input already
    in place (same address) and copies nothing, instead of one copy of each per layer.
    """

    layers: list
    rotary: torch.Tensor
    cu_seqlens: torch.Tensor
    segments: tuple[tuple[int, int], ...]
    """The layer range ``[start, end)`` each graph of ``layers`` spans (one per layer: ``(i, i + 1)``)."""

    @property
    def budget(self) -> int:
        return self.rotary.size(0)

    def load(self, rotary: torch.Tensor, seqlens: torch.Tensor, layout: PackedLayout) -> None:
        """Write a micro-batch's rotary embedding (``n`` rows, zeros after) and its ``cu_seqlens`` (computed from
        the CPU ``seqlens``, copied through pinned memory without waiting) into the static inputs."""
        n = rotary.size(0)
        self.rotary[:n].copy_(rotary)
        self.rotary[n:].zero_()
        cpu = padded_cu_seqlens(seqlens, self.budget, layout)
        self.cu_seqlens.copy_(cpu.pin_memory() if torch.cuda.is_available() else cpu, non_blocking=True)


class VisionGraphHelper(LadderHelper):
    """Captures the vision layers once per token budget and replays them for the encoder's forward
    (:meth:`replay_encoder`, which the encoder asks first).

    Follows megatron-core's ``TECudaGraphHelper`` protocol (``create_cudagraphs``, ``graphs_created``,
    ``cuda_graph_set_manual_hooks``, ``delete_cuda_graphs``), so one lifecycle owner drives both submodules.

    Args:
        model: The DDP-wrapped model chunks (to zero gradient buffers after capture and make DDP hooks).
        vision_model: The :class:`GraphedQwen3VLVisionModel` inside ``model``.
        budgets: Static lengths in patches, ascending; each a multiple of ``spatial_merge_size**2``.
        max_segments: Most image frames a micro-batch may hold and still replay.
        max_seqlen: Most patches of one frame that replay (the static attention ``max_seqlen``); None: the
            largest budget. A frame above it runs the micro-batch eagerly (counted).
        num_warmup_iters: TE warmup iterations per callable before capture.
        on_capture_error: ``"eager"`` or ``"raise"``.
        copies: Independent graph sets, one per micro-batch the schedule keeps in flight
            (:func:`~bridge_cudagraph.plan.budgets.in_flight_microbatches`; 1 without a pipeline).
        static_inputs: The plan's static inputs (:class:`~bridge_cudagraph.plan.capture_plan.StaticInput`) per
            budget; the capture buffers are checked against them (None: not checked, for callers without a plan).
        graph_unit: ``run`` or ``layer``: the layers each graph spans
            (:func:`~bridge_cudagraph.plan.budgets.layer_segments`).
    """

    submodule = "vision"
    unit = "patches"

    def __init__(
        self,
        model: Sequence[torch.nn.Module],
        vision_model: GraphedQwen3VLVisionModel,
        *,
        budgets: Sequence[int],
        max_segments: int,
        max_seqlen: int | None = None,
        num_warmup_iters: int = 3,
        on_capture_error: str = "eager",
        copies: int = 1,
        static_inputs: Mapping[int, Sequence[StaticInput]] | None = None,
        graph_unit: str = "run",
    ) -> None:
        if not isinstance(vision_model, GraphedQwen3VLVisionModel):
            raise CaptureError(
                "vision graphs need the encoder built by a bridge_cudagraph provider "
                "(CudaGraphQwen3VLModelProvider or with_cuda_graphs(provider)); got "
                f"{type(vision_model).__name__}"
            )
        budgets = sorted(int(b) for b in budgets)  # the plan's, checked by plan.checks.check_model
        self.model = list(model)
        self.vision_model = vision_model
        self.budgets = budgets
        self.max_segments = int(max_segments)
        if max_seqlen is not None and max_seqlen < 1:
            raise CaptureError(f"vision max_seqlen must be >= 1 patch, got {max_seqlen}")
        self.layout = PackedLayout(
            tuple(budgets), max_sequences=self.max_segments, max_seqlen=int(max_seqlen or budgets[-1])
        )
        self.cu_seqlens_length = self.layout.cu_seqlens_length
        self.planned_inputs = {int(b): tuple(v) for b, v in (static_inputs or {}).items()}
        if self.planned_inputs and sorted(self.planned_inputs) != budgets:
            raise CaptureError(
                f"vision: the plan's static inputs are for budgets {sorted(self.planned_inputs)}, not {budgets}"
            )
        if graph_unit not in GRAPH_UNITS:
            raise CaptureError(f"vision graph_unit must be one of {list(GRAPH_UNITS)}, got {graph_unit!r}")
        self.graph_unit = graph_unit
        self.segments = layer_segments(
            len(vision_model.decoder.layers), vision_model.decoder.deepstack_visual_indexes, graph_unit
        )
        self.num_warmup_iters = num_warmup_iters
        self.on_capture_error = on_capture_error
        self.copies = GraphCopies(int(copies))
        self.ladder = BudgetLadder(budgets)
        #: ``graphs[budget][copy]``: the graphed layers and their static inputs.
        self.graphs: dict[int, list[GraphSet]] = {}
        self._pools: list = []
        self._statics = [StaticBuffers() for _ in range(self.copies.count)]
        #: Parameters whose weight gradient TE accumulates into ``main_grad`` inside the graph (see before_replay).
        self._fused_grad_params: list[torch.nn.Parameter] = []
        self._manual_hooks = False
        self.stats = CaptureStats(self.submodule, layers=len(vision_model.decoder.layers))
        self._warned_fallback = False
        self._warned_no_copy = False
        self._warned_above = False
        #: Replays that read their grid back from the device (no CPU copy bound,
        #: :mod:`bridge_cudagraph.vision.cpu_grids`): each waited for the GPU's queue.
        self.grids_read_back = 0
        vision_model.graph_helper = self

    # ------------------------------------------------------------------ selection
    def budget_for(self, patches: int, segments: int, longest: int = 0) -> int | None:
        """The smallest budget that holds ``patches`` in ``segments`` frames, the longest ``longest`` patches, or
        None (eager)."""
        if longest > self.layout.max_seqlen:
            return None
        return self.layout.budget_for(patches, segments)

    def captured_budget_for(self, patches: int, segments: int, longest: int = 0) -> int | None:
        """:meth:`budget_for` when that budget is captured; else None, and a budget above the captured top is asked
        for (:class:`~bridge_cudagraph.capture.budget_ladder.BudgetLadder`) and counted."""
        budget = self.budget_for(patches, segments, longest)
        if budget is None or self.ladder.holds(budget):
            return budget
        self.ladder.want(budget)
        self.stats.above_captured += 1
        return None

    def observe(self, patches: int) -> None:
        """A training micro-batch of ``patches`` ran eagerly before capture."""
        self.ladder.observe(patches)

    def count_fallback(self, patches: int, segments: int, *, no_free_copy: bool = False, above: bool = False) -> None:
        """Count an eager micro-batch; log the first one of each cause with the numbers and the fix."""
        self.stats.eager_fallbacks += 1
        if above:
            if not self._warned_above:
                self._warned_above = True
                logger.warning(
                    "bridge_cudagraph: a vision micro-batch of %d patches is above the captured budgets (up to %d, "
                    "chosen from the micro-batches before capture); it runs eagerly (counted in stats) and its "
                    "budget is captured before the next step where memory allows",
                    patches,
                    self.ladder.top,
                )
            return
        if no_free_copy:
            if not self._warned_no_copy:
                self._warned_no_copy = True
                logger.warning(
                    "bridge_cudagraph: a vision micro-batch found all %d vision graph copies in flight (their "
                    "backward has not run yet); it runs eagerly (counted in stats). The copies follow the "
                    "pipeline's in-flight micro-batches; a schedule that keeps more needs more copies.",
                    self.copies.count,
                )
            return
        if not self._warned_fallback:
            self._warned_fallback = True
            logger.warning(
                "bridge_cudagraph: a micro-batch with %d patches in %d image frames exceeds the vision graphs "
                "(largest budget %d patches, at most %d frames); it runs eagerly (counted in stats). Raise "
                "model.cuda_graph.vision.token_budgets / max_images_per_microbatch to graph such batches.",
                patches,
                segments,
                self.budgets[-1],
                self.max_segments,
            )

    def before_replay(self) -> None:
        """Mark the fused-accumulation weights as "already added to main_grad", as TE's Python did at capture.

        Inside a graph TE accumulates these weight gradients into ``main_grad`` and returns a placeholder; the
        flag tells Megatron's DDP hook not to add the placeholder. DDP's ``zero_grad_buffer`` clears the flag
        every step unless the *language* config uses TE graphs, and a replay runs no TE Python to set it again.
        """
        for param in self._fused_grad_params:
            param.grad_added_to_main_grad = True  # type: ignore[attr-defined]  # Megatron's flag on a Parameter

    # ------------------------------------------------------------------ replay
    def replay_encoder(
        self, encoder: GraphedQwen3VLVisionModel, hidden_states: torch.Tensor, grid_thw: torch.Tensor, inference_params
    ) -> tuple[torch.Tensor, list[torch.Tensor]] | None:
        """The encoder's training forward on the graphs (what Bridge's ``Qwen3VLVisionModel.forward`` returns: the
        merged rows and the deepstack features), or None: Bridge's forward runs. None before capture (the micro-batch's
        patches tell the ladder) and for a micro-batch that fits no captured budget or finds no free copy (counted)."""
        if not self.graphs_created():
            self.observe(hidden_states.size(0))  # one row per patch: the ladder's top follows the data
            return None
        assert inference_params is None and encoder.input_tensor is None
        grid = self._cpu_grid(grid_thw)
        seqlens = frame_seqlens(grid)
        n = int(seqlens.sum())
        longest = int(seqlens.max()) if seqlens.numel() else 0
        budget = self.captured_budget_for(n, seqlens.numel(), longest)
        copy = None if budget is None else self.copies.acquire()
        if budget is None or copy is None:
            above = budget is None and self.budget_for(n, seqlens.numel(), longest) is not None
            self.count_fallback(n, seqlens.numel(), no_free_copy=budget is not None, above=above)
            return None
        x = encoder.patch_embed(hidden_states)
        if x.size(0) != n:
            self.copies.release_now(copy)
            raise ValueError(
                f"vision input has {x.size(0)} patch rows but image_grid_thw describes {n} (sum of t*h*w); "
                "pixel_values and image_grid_thw must come from the same processor call"
            )
        pos_embeds, rotary = encoder.position_inputs(grid)
        x = x + pos_embeds
        h = F.pad(x, (0, 0, 0, budget - n))[:, None]
        graphs = self.graphs[budget][copy]
        graphs.load(rotary, seqlens, self.layout)
        self.before_replay()
        block = encoder.decoder
        deepstack: list[torch.Tensor] = []

        def merge(end: int, h: torch.Tensor) -> torch.Tensor:
            if end - 1 in block.deepstack_visual_indexes:  # a segment ends at each deepstack layer
                merger = block.deepstack_merger_list[block.deepstack_visual_indexes.index(end - 1)]
                deepstack.append(merger(h[:n]))
            return h

        statics = (graphs.rotary, graphs.cu_seqlens)
        h = replay_segments(block, graphs.layers, h, statics, graphs.segments, after_segment=merge)
        self.copies.release_after_backward(copy, h)
        self.stats.replays += 1
        return encoder.merger(h[:n]), deepstack

    def _cpu_grid(self, grid_thw: torch.Tensor) -> torch.Tensor:
        """The grid on the CPU, read once: Bridge's position helpers read it element by element, several device syncs
        per image on a device tensor (136 for eight images), none on a CPU one (same values). The collate's CPU copy
        where the forward bound one (:meth:`~bridge_cudagraph.micro_batch.MicroBatch.cpu_copy`); else read back, which
        waits for the queue (counted: :attr:`grids_read_back`)."""
        micro_batch = current_micro_batch()
        grid = None if micro_batch is None else micro_batch.cpu_copy(grid_thw)
        if grid is None:
            grid = grid_thw.cpu()
            self.grids_read_back += 1
        return grid

    # ------------------------------------------------------------------ capture
    def _sample_inputs(
        self, budget: int, graphs: int, statics: StaticBuffers
    ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """Hidden states for each of ``graphs`` graphs, and the rotary embedding and ``cu_seqlens`` all of them
        share (the static inputs of :class:`GraphSet`); the first two are views of the copy's shared buffers."""
        vm = self.vision_model
        device = torch.cuda.current_device()
        dtype = next(vm.decoder.layers.parameters()).dtype
        hidden = vm.config.hidden_size
        # Two rows of merge blocks: a valid image grid for any budget that is a multiple of merge**2.
        grid = torch.tensor([[1, vm.spatial_merge_size, budget // vm.spatial_merge_size]], device=device)
        with torch.no_grad():
            table = rotary_input(vm.rot_pos_emb(grid))
            rotary = statics.view("rotary", table.shape, table.dtype)
            rotary.copy_(table)
        # Warmup values only (every replay writes its own): one real segment as long as replay allows, then padding.
        first = min(budget, self.layout.max_seqlen)
        cu = torch.tensor(self.layout.static_cu_seqlens([0, first], budget), dtype=torch.int32, device=device)
        hidden_states = [
            statics.view(f"hidden_states.{i}", (budget, 1, hidden), dtype, requires_grad=True) for i in range(graphs)
        ]
        with torch.no_grad():
            for h in hidden_states:
                h.copy_(torch.randn_like(h) * 0.02)
        planned = self.planned_inputs.get(budget, ())
        check_static_inputs(
            {"hidden_states": hidden_states[0], "rotary_pos_emb": rotary, "cu_seqlens": cu}, planned, self.submodule
        )
        return hidden_states, rotary, cu

    def _captured_layers(self) -> list:
        return list(self.vision_model.decoder.layers)

    def _capture_rung(self, budget: int, copy: int, pool) -> GraphSet:
        return self._capture_budget(self._captured_layers(), budget, copy, pool)

    def _capture_budget(self, layers: list, budget: int, copy: int, pool) -> GraphSet:
        """One set of graphed layers at ``budget`` patches, in ``pool``."""
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker
        from transformer_engine.pytorch import make_graphed_callables

        max_seqlen = min(budget, self.layout.max_seqlen)
        hidden_states, rotary, cu = self._sample_inputs(budget, len(self.segments), self._statics[copy])
        callables = segment_callables(layers, self.segments, lambda layer: _PackedVisionLayer(layer, max_seqlen))
        with get_cuda_rng_tracker().fork() if self.vision_model.config.sequence_parallel else contextlib.nullcontext():
            graphed = make_graphed_callables(
                callables,
                tuple((h, rotary, cu) for h in hidden_states),
                num_warmup_iters=self.num_warmup_iters,
                allow_unused_input=True,
                pool=pool,
                **ladder_order_kwargs(len(callables)),
            )
        return GraphSet(list(graphed), rotary, cu, segments=self.segments)

    def _set_manual_hooks(self) -> None:
        # The replay runs them before each layer's graph; upstream's vision helper makes this a no-op.
        chunk = next(c for c in self.model if _contains(c, self.vision_model))
        for layer in self.vision_model.decoder.layers:
            layer.setup_manual_hooks(param_gather_hook_maker(chunk))

    def _hooked_layers(self) -> list:
        return self._captured_layers()


def _contains(root: torch.nn.Module, module: torch.nn.Module) -> bool:
    return any(m is module for m in root.modules())
