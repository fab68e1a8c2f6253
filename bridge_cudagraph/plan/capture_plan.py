"""What will be captured: the frozen :class:`CapturePlan` and its parts, derived purely from plain numbers.
 :mod:`bridge_cudagraph.config` holds what the user *asked for* (mutable, because Bridge's overrides ``setattr`` into
it); the plan holds what will actually be *done*: the process-group layouts of the language model and the vision
encoder, how many layers each pipeline stage captures, how many graphs that makes, the static input shapes of every
graph and the token budgets. Immutable, so the CLI, the capture code and the tests read the same decisions.

Units: language shapes (and packed language budgets) are in tokens; vision budgets are in *patches*, the unit the
vision layers run on (before the ``spatial_merge_size**2`` merge into the language model's image tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge_cudagraph.config import FORWARD_PARTS
from bridge_cudagraph.parallel.layout import (
    ResolvedLayout,
)
from bridge_cudagraph.plan.budgets import (
    PackedLayout,
)
from bridge_cudagraph.plan.facts import ModelFacts

# ----------------------------------------------------------------------------------------------- plan
#: The dtype names of :class:`StaticInput`, as ``torch`` attribute names (the plan itself never imports torch).
TORCH_DTYPE_NAMES: dict[str, str] = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp32": "float32",
    "bool": "bool",
    "int32": "int32",
}


@dataclass(frozen=True, slots=True)
class StaticInput:
    """One captured input of a graph: a static buffer that every replay refreshes, so its shape is fixed here.

    Data, not text: the capture code allocates its buffers from it or checks them against it, and :meth:`describe`
    renders it for ``bridge-cudagraph plan``.

    Attributes:
        name: The argument of the graphed layer it feeds (``hidden_states``, ``cu_seqlens``...).
        shape: Its dimensions.
        dtype: ``bf16``, ``fp16``, ``fp32``, ``bool`` or ``int32`` (:data:`TORCH_DTYPE_NAMES`).
        dims: What each dimension is (``S/cp``, ``mbs``, ``H``), for display; an empty label prints the number
            alone, and no labels at all print only numbers.
        note: Printed after the dtype (``(mRoPE)``).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    dims: tuple[str, ...] = ()
    note: str = ""

    def __post_init__(self) -> None:
        if self.dims and len(self.dims) != len(self.shape):
            raise ValueError(f"{self.name}: {len(self.dims)} dimension labels for shape {self.shape}")
        if self.dtype not in TORCH_DTYPE_NAMES:
            raise ValueError(f"{self.name}: unknown dtype {self.dtype!r}; one of {sorted(TORCH_DTYPE_NAMES)}")

    @property
    def torch_dtype_name(self) -> str:
        """The ``torch`` attribute of :attr:`dtype` (``getattr(torch, input.torch_dtype_name)``)."""
        return TORCH_DTYPE_NAMES[self.dtype]

    def describe(self) -> str:
        """``hidden_states (S/cp=4096, mbs=2, H=4096) bf16``."""
        labels = self.dims or ("",) * len(self.shape)
        parts = [f"{label}={n}" if label else str(n) for label, n in zip(labels, self.shape, strict=True)]
        inner = parts[0] + "," if len(parts) == 1 else ", ".join(parts)
        return f"{self.name} ({inner}) {self.dtype}" + (f" {self.note}" if self.note else "")


@dataclass(frozen=True, slots=True)
class PackedLanguagePlan:
    """The packed (THD) language graphs: one graph set per token budget (:mod:`bridge_cudagraph.capture.packed`).

    Attributes:
        token_budgets: Static token counts of the decoder input, ascending.
        budgets_derived: Derived (``token_budgets: null``), not given.
        max_tokens: Most tokens a packed micro-batch carries (micro batch x the padded ``seq_length``).
        multiple: What every packed width is a multiple of (micro batch x Bridge's row rounding and the
            sequence-parallel split); derived budgets are multiples of it.
        max_sequences: Sequences a micro-batch may hold and replay.
        max_seqlen: Longest sequence that replays, the static attention ``max_seqlen``: :attr:`row_width`, or below
            it under TE's deterministic kernels (:attr:`max_seqlen_source`).
        row_width: The widest row the data path makes (``seq_length`` as the data path rounds it).
        separate_padded: The data path hands a ``cu_seqlens_q_padded`` tensor of its own (TE then assumes padding
            between sequences and picks its backend accordingly; the graphs are captured the same way).
        static_inputs: ``(budget, inputs)`` for every budget.
        copies: Graph sets, one per micro-batch a stage keeps in flight (1 without a pipeline).
        offline: The rows come packed from GPT SFT's offline packing (one budget: ``seq_length``), not from the
            Qwen3-VL step.
        sequences_source: Where a derived ``max_sequences`` comes from (empty when the block sets it).
        tight: Tight packing (:mod:`bridge_cudagraph.capture.tight`): the replay runs each row's needed prefix only,
            at the budget of the rows' kept tokens.
        tight_source: Why :attr:`tight` is on or off.
        max_seqlen_source: Why :attr:`max_seqlen` is below :attr:`row_width` (empty where it is not).
        deterministic_workspace: Under TE's deterministic kernels, the workspace cuDNN's deterministic attention
            backward asks for at the static shape of the top budget (counted into the pool estimate); 0 otherwise.
        budgets_source: Why a derived ladder lost its top rungs under TE's deterministic kernels (empty where not).
    """

    token_budgets: tuple[int, ...]
    budgets_derived: bool
    max_tokens: int
    multiple: int
    max_sequences: int
    max_seqlen: int
    separate_padded: bool
    static_inputs: tuple[tuple[int, tuple[StaticInput, ...]], ...]
    copies: int
    offline: bool = False
    sequences_source: str = ""
    tight: bool = False
    tight_source: str = ""
    row_width: int = 0
    max_seqlen_source: str = ""
    deterministic_workspace: int = 0
    budgets_source: str = ""

    @property
    def layout(self) -> PackedLayout:
        """The static layout the capture and the replay use."""
        return PackedLayout(self.token_budgets, max_sequences=self.max_sequences, max_seqlen=self.max_seqlen)


@dataclass(frozen=True, slots=True)
class PaddedLanguagePlan:
    """Whole layers of padded (BSHD) micro-batches on the ladder engine (:mod:`bridge_cudagraph.capture.padded`), the
    engine of the packed graphs and of the vision graphs: one rung, the full width every micro-batch has.

    Attributes:
        rows: Rows of a micro-batch (the micro-batch size).
        width: Tokens of a row the decoder sees (``seq_length / cp``).
        copies: Graph sets, one per micro-batch a stage keeps in flight (1 without a pipeline).
        static_inputs: The inputs of every graph.
    """

    rows: int
    width: int
    copies: int
    static_inputs: tuple[StaticInput, ...]

    @property
    def token_budgets(self) -> tuple[int, ...]:
        """The one rung, in tokens: what the ladder's memory estimate and capture count in."""
        return (self.rows * self.width,)


@dataclass(frozen=True, slots=True)
class LanguagePlan:
    """The language model's graphs on each pipeline stage.

    Attributes:
        enabled: Whether language graphs are captured.
        modules: Captured part of each layer; ``None`` captures whole layers.
        layers_per_stage: Decoder layers each pipeline stage builds.
        captured_per_stage: Of those, the layers with graphs (Megatron-Core's ``_layer_is_graphable``).
        graphs_per_unit: Graphs per captured unit (a layer, or a run of layers): 1 when ``pp == 1``, else one per
            micro-batch of the step (with a pipeline several micro-batches are in flight, and each needs its own
            static buffers); packed: one per budget and in-flight copy.
        graphs_per_stage: Graphs each rank of a stage captures: ``units x graphs_per_unit``.
        warmup_steps: Eager steps before capture, resolved (see :func:`_warmups`).
        packed: The packed (THD) graphs when the data path packs, else None (one static BSHD shape).
        padded: The padded (BSHD) graphs when the data path pads, else None.
        graph_unit: What one graph spans, resolved: ``run`` (a run of layers between deepstack merges) or
            ``layer``.
        deepstack_merges: Layers of the first pipeline stage after which Qwen3-VL's decoder adds a deepstack feature
            (its first ``len(deepstack_visual_indexes)`` layers); 0 for GPT. A run never spans one.
        segments_per_stage: The layer ranges ``[start, end)`` of each stage's graphs, in the stage's own layer
            indices (:func:`~bridge_cudagraph.plan.budgets.layer_segments`); the helpers build them the same way.
        warmup_source: The setting a derived ``warmup_steps`` comes from (empty when the block sets it).
        unit_source: Why a derived ``graph_unit`` is ``layer`` (empty when set, or derived as ``run``).
        modules_source: Why :attr:`modules` differs from the block's ``modules: null`` (an MoE model: the attention
            alone, :data:`~bridge_cudagraph.plan.checks.MOE_ATTENTION_SCOPE`); empty otherwise.
    """

    enabled: bool
    modules: tuple[str, ...] | None
    layers_per_stage: tuple[int, ...]
    captured_per_stage: tuple[int, ...]
    graphs_per_unit: int
    graphs_per_stage: tuple[int, ...]
    warmup_steps: int
    packed: PackedLanguagePlan | None = None
    padded: PaddedLanguagePlan | None = None
    graph_unit: str = "layer"
    deepstack_merges: int = 0
    segments_per_stage: tuple[tuple[tuple[int, int], ...], ...] = ()
    warmup_source: str = ""
    unit_source: str = ""
    modules_source: str = ""

    @property
    def graphs(self) -> int:
        """Graphs on the busiest rank."""
        return max(self.graphs_per_stage, default=0)

    @property
    def static_inputs(self) -> tuple[StaticInput, ...]:
        """Captured inputs of every padded graph (:attr:`padded`'s); packed graphs keep theirs per budget
        (:attr:`packed`)."""
        return self.padded.static_inputs if self.padded is not None else ()

    @property
    def ladder(self) -> PackedLanguagePlan | PaddedLanguagePlan | None:
        """The graphs on the ladder engine (packed or padded), or None when the language graphs are off."""
        return self.packed if self.packed is not None else self.padded


@dataclass(frozen=True, slots=True)
class VisionPlan:
    """The vision encoder's graphs: one set per token budget, of one graph per segment of layers (``segments``).

    Attributes:
        enabled: Whether vision graphs are captured.
        depth: Encoder layers.
        modules: Captured part of each layer; ``None`` captures whole layers.
        token_budgets: Static lengths in patches, ascending; a micro-batch uses the smallest that holds it.
        budgets_derived: The budgets were derived (``token_budgets: null``), not given.
        max_patches_per_microbatch: Most patches one micro-batch can carry (the language sequence bounds it).
        max_images_per_microbatch: Image frames a micro-batch may hold and replay (``cu_seqlens`` has two more
            entries: the leading 0 and the padding segment).
        images_derived: ``max_images_per_microbatch`` was derived, not given.
        images_source: How a derived ``max_images_per_microbatch`` follows from the data path's smallest image (empty:
            given, or derived from images of 4x4 merged tokens where the data path names no floor).
        max_patches_per_image: Most patches of one image (frame) that replay: the static attention ``max_seqlen``
            (unless set: from the data path's max_pixels, at most the largest budget; see ``patches_source``).
        static_inputs: ``(budget, inputs)`` for every budget.
        copies: Independent graph sets, one per micro-batch the first pipeline stage keeps in flight (1 without a
            pipeline; :func:`~bridge_cudagraph.plan.budgets.in_flight_microbatches`).
        graphs: Graphs on each vision rank: ``len(segments) x len(token_budgets) x copies``.
        warmup_steps: Eager steps before capture, resolved (see :func:`_warmups`).
        graph_unit: What one graph spans: ``run`` (the layers up to each deepstack layer) or ``layer``,
            resolved.
        patches_source: Where a derived ``max_patches_per_image`` comes from (empty when the block sets it).
        warmup_source: The setting a derived ``warmup_steps`` comes from (empty when the block sets it).
        deterministic_workspace: Under TE's deterministic kernels, the workspace cuDNN's deterministic attention
            backward asks for at the static shape (bytes, per copy; :mod:`bridge_cudagraph.plan.determinism`); 0
            otherwise.
        budgets_source: Why a derived ladder lost its top rungs under TE's deterministic kernels (empty where not).
    """

    enabled: bool
    depth: int
    modules: tuple[str, ...] | None
    token_budgets: tuple[int, ...]
    budgets_derived: bool
    max_patches_per_microbatch: int
    max_images_per_microbatch: int
    images_derived: bool
    static_inputs: tuple[tuple[int, tuple[StaticInput, ...]], ...]
    copies: int
    graphs: int
    warmup_steps: int
    max_patches_per_image: int = 0
    graph_unit: str = "run"
    patches_source: str = ""
    warmup_source: str = ""
    deterministic_workspace: int = 0
    images_source: str = ""
    budgets_source: str = ""

    segments: tuple[tuple[int, int], ...] = ()
    """The layer ranges ``[start, end)`` of one budget's graphs
    (:func:`~bridge_cudagraph.plan.budgets.layer_segments`)."""

    @property
    def graphs_per_budget(self) -> int:
        """Graphs one budget's set holds: one per segment."""
        return len(self.segments)

    @property
    def layout(self) -> PackedLayout:
        """The static ``cu_seqlens`` layout the capture and the replay use."""
        return PackedLayout(
            self.token_budgets, max_sequences=self.max_images_per_microbatch, max_seqlen=self.max_patches_per_image
        )

    def inputs_at(self, budget: int) -> tuple[StaticInput, ...]:
        """The static inputs of the graphs at ``budget`` patches."""
        return dict(self.static_inputs)[budget]


GIB = 2**30


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Bytes on the busiest rank (pipeline stage 0: the embedding, the vision encoder and the first layers).

    Attributes:
        weights: Model parameters (bf16), language and vision.
        gradients: Gradient buffers of the trainable parameters.
        optimizer: fp32 master weights and Adam's two moments of the trainable parameters (sharded over dp with
            the distributed optimizer).
        logits: The output layer's logits and the loss of the largest micro-batch (eager, outside the graphs).
        language_graphs: The language graph pool(s) at the planned top.
        vision_graphs: The vision graph pool(s) at the planned top.
        language_top: Tokens of the shape the language estimate is for (the ladder's top, or the padded micro-batch).
        vision_top: Patches of the vision estimate's shape.
        language_ladder: The language graphs are a packed ladder (its budgets can be lowered), not one padded shape.
    """

    weights: int
    gradients: int
    optimizer: int
    logits: int
    language_graphs: int
    vision_graphs: int
    language_top: int = 0
    vision_top: int = 0
    language_ladder: bool = False

    @property
    def static(self) -> int:
        """What the run holds with graphs or without: weights, gradients, optimizer state."""
        return self.weights + self.gradients + self.optimizer

    @property
    def graphs(self) -> int:
        """Both graph pools."""
        return self.language_graphs + self.vision_graphs

    @property
    def total(self) -> int:
        """The estimate of the graphed run's peak: the static state, the pools and the eager logits."""
        return self.static + self.graphs + self.logits

    def describe(self) -> list[str]:
        """The plan's memory lines (GiB, one decimal)."""

        def gib(n: int) -> str:
            return f"{n / GIB:.1f}"

        lines = [
            f"memory per rank (estimate, GiB): weights {gib(self.weights)}, gradients {gib(self.gradients)}, "
            f"optimizer {gib(self.optimizer)}, logits {gib(self.logits)}",
        ]
        parts = []
        if self.language_graphs:
            parts.append(f"language {gib(self.language_graphs)} at {self.language_top} tokens")
        if self.vision_graphs:
            parts.append(f"vision {gib(self.vision_graphs)} at {self.vision_top} patches")
        if parts:
            lines.append(f"  graph pools: {', '.join(parts)} (top budgets; captured tops follow the data)")
        lines.append(f"  total {gib(self.total)} GiB with graphs, {gib(self.static + self.logits)} GiB of it without")
        return lines


@dataclass(frozen=True, slots=True)
class ForwardPlan:
    """Which parts of Qwen3-VL's forward run this plugin's way (``model.cuda_graph.forward`` resolved;
    :mod:`bridge_cudagraph.host.forward`): each on wherever graphs are on a Qwen3-VL model, unless the block turns it
    off or it needs a part that is off.

    Attributes:
        positions: The mRoPE positions from copies on the CPU.
        merges: The deepstack and image-token merges by row positions.
        flat_rows: The step's packed rows handed to the forward flat.
        collated_grids: The collate's grids bound to the forward's device tensors.
        off_reasons: ``(part, why)`` for each part that is off on a graphed Qwen3-VL model.
    """

    positions: bool = False
    merges: bool = False
    flat_rows: bool = False
    collated_grids: bool = False
    off_reasons: tuple[tuple[str, str], ...] = ()

    @property
    def parts(self) -> tuple[str, ...]:
        """The parts that are on (names of ``model.cuda_graph.forward``), in the block's order."""
        return tuple(name for name in FORWARD_PARTS if getattr(self, name))


@dataclass(frozen=True, slots=True)
class CachedWalksPlan:
    """Which per-step walks are done once (``model.cuda_graph.cached_walks`` resolved): each on wherever graphs are,
    unless the block turns it off.

    Attributes:
        optimizer: The optimizer step's per-parameter walks (:mod:`bridge_cudagraph.host.optimizer`).
        grad_finalize: The gradient finalisation's module walk (:mod:`bridge_cudagraph.host.finalize`).
    """

    optimizer: bool = False
    grad_finalize: bool = False


@dataclass(frozen=True, slots=True)
class CapturePlan:
    """Everything that will be captured, for one model on one world size.

    Built by :func:`build_plan`; immutable, so the CLI, the capture code and the tests all read the same
    decisions.

    Attributes:
        facts: The model numbers the plan was built from.
        world_size: Ranks of the job.
        micro_batch_size: Micro-batch size (static dimension of every language graph).
        global_batch_size: Global batch size, when known.
        num_microbatches: Micro-batches per step (explicit, or global batch / (micro batch x dp)); None when
            it cannot be derived and no language graphs need it.
        layouts: Resolved layouts, language first, then vision when the model has an encoder.
        language: The language graphs.
        vision: The vision graphs, or None for a text-only model.
        on_capture_error: ``eager`` or ``raise``.
        cached_walks: The per-step walks done once (:mod:`bridge_cudagraph.host.step`).
        forward: The parts of Qwen3-VL's forward run without waiting for the GPU
            (:mod:`bridge_cudagraph.host.forward`); all off on a model without a vision encoder.
        memory: The busiest rank's memory, estimated (:mod:`bridge_cudagraph.plan.memory`); None where the plan was
            built without the training facts (a plan of the provider alone).
        num_microbatches_source: How a derived ``num_microbatches`` was derived (empty when the block sets it).
        switches_defaulted: The block's switches left null that the plan turns on (``cached_walks.optimizer``,
            ``forward.positions``, ...).
    """

    facts: ModelFacts
    world_size: int
    micro_batch_size: int
    global_batch_size: int | None
    num_microbatches: int | None
    layouts: tuple[ResolvedLayout, ...]
    language: LanguagePlan
    vision: VisionPlan | None
    on_capture_error: str
    cached_walks: CachedWalksPlan = CachedWalksPlan()
    forward: ForwardPlan = ForwardPlan()
    memory: MemoryEstimate | None = None
    num_microbatches_source: str = ""
    switches_defaulted: tuple[str, ...] = ()

    @property
    def language_layout(self) -> ResolvedLayout:
        """The language model's layout."""
        return self.layouts[0]

    @property
    def vision_layout(self) -> ResolvedLayout | None:
        """The vision encoder's layout, or None for a text-only model."""
        return self.layouts[1] if len(self.layouts) > 1 else None

    @property
    def total_graphs(self) -> int:
        """Graphs on the busiest rank (stage 0 holds the vision encoder and the first language layers)."""
        vision = self.vision.graphs if self.vision is not None and self.vision.enabled else 0
        language = self.language.graphs_per_stage[0] if self.language.graphs_per_stage else 0
        return max(language + vision, self.language.graphs)

    def describe(self) -> str:
        """A readable multi-line block for logs and the CLI (:func:`bridge_cudagraph.plan.describe.describe_plan`)."""
        from bridge_cudagraph.plan.describe import describe_plan

        return describe_plan(self)
