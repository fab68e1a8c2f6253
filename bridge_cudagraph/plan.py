"""What will be captured: the frozen :class:`CapturePlan`, derived purely from plain numbers.

:mod:`bridge_cudagraph.config` holds what the user *asked for* (mutable, because Bridge's overrides
``setattr`` into it). This module decides what will actually be *done*: the process-group layouts of the
language model and the vision encoder, how many layers each pipeline stage captures, how many graphs that
makes, the static input shapes of every graph and the vision token budgets. It is pure: the inputs are
:class:`ModelFacts` (plain ints and strings read off a provider by :func:`model_facts`) and the config
block, so the CLI prints a plan for 64 GPUs on a laptop and the unit tests cover it with plain integers
(vLLM's encoder graph manager, by contrast, ties its budget planning to its engine object and its tests
have to build the manager with ``object.__new__``).

Every configuration that cannot be graphed is refused here, at config time, with an error that names the
setting, shows the arithmetic and says what to change, instead of a shape error at step N.

Units: language shapes (and packed language budgets) are in tokens; vision budgets are in *patches*, the unit
the vision layers run on (before the ``spatial_merge_size**2`` merge into the language model's image tokens).
Derived budgets come from :mod:`bridge_cudagraph.budgets`, the functions the vision capture itself uses, so
the plan and the capture cannot disagree.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from bridge_cudagraph.budgets import (
    LADDER_STEPS,
    MIN_IMAGE_MERGED_TOKENS,
    PackedLayout,
    check_token_budgets,
    derive_language_budgets,
    derive_max_segments,
    derive_token_budgets,
    in_flight_microbatches,
    language_segments,
    layer_segments,
    max_patches_per_microbatch,
)
from bridge_cudagraph.config import CudaGraphConfig, CudaGraphConfigError
from bridge_cudagraph.layout import (
    ParallelLayout,
    ResolvedLayout,
    Submodule,
    VisionLayout,
    check_vision_heads,
    format_layout,
    resolve_submodules,
)
from bridge_cudagraph.memory import MemoryEstimate, TrainingFacts, estimate
from bridge_cudagraph.sizes import check_positive as _check_positive

__all__ = [
    "CapturePlan",
    "ImageFacts",
    "LanguagePlan",
    "ModelFacts",
    "PackedLanguagePlan",
    "PackingFacts",
    "StaticInput",
    "VisionFacts",
    "VisionPlan",
    "build_plan",
    "check_model",
    "check_packed_context_parallel",
    "model_facts",
    "plan_for",
]


# ---------------------------------------------------------------------------------------------- facts
@dataclass(frozen=True, slots=True)
class VisionFacts:
    """The vision encoder numbers a plan needs (Qwen3-VL's HF ``vision_config``).

    Attributes:
        depth: Transformer layers of the encoder.
        hidden_size: Encoder width ``Hv``.
        num_heads: Encoder attention heads; vision tp must divide them.
        patch_size: Spatial patch edge in pixels.
        temporal_patch_size: Frames per patch.
        spatial_merge_size: Edge of the patch block merged into one language token (2 for Qwen3-VL).
        deepstack_visual_indexes: Encoder layers whose outputs feed the language model (deepstack).
        num_position_embeddings: Learned position table size; upstream derives its vision graph length from it.
        intermediate_size: Width of each layer's MLP (None: 4 x ``hidden_size``), for the memory estimate.
        out_hidden_size: Width of the merged tokens handed to the language model (None: ``hidden_size``).
    """

    depth: int
    hidden_size: int
    num_heads: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    deepstack_visual_indexes: tuple[int, ...] = ()
    num_position_embeddings: int | None = None
    intermediate_size: int | None = None
    out_hidden_size: int | None = None

    @property
    def merge_unit(self) -> int:
        """Patches per merged language token: ``spatial_merge_size**2``."""
        return self.spatial_merge_size**2

    @property
    def head_dim(self) -> int:
        """Per-head width ``Hv / heads``, also the width of the 2-D rotary table the layers read."""
        return self.hidden_size // self.num_heads


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """The numbers of a model provider that decide layouts, graphs and static shapes.

    Plain values only, so a plan can be built and tested without a provider, a GPU or Megatron.

    Attributes:
        provider: Class name of the provider the facts were read from (for messages).
        num_layers: Language decoder layers.
        hidden_size: Language hidden size ``H``.
        num_attention_heads: Language attention heads.
        kv_channels: Per-head width (``hidden_size / heads`` when the provider leaves it unset).
        rotary_percent: Fraction of ``kv_channels`` that is rotated.
        seq_length: Training sequence length ``S`` (static for graphs).
        tp: Language tensor-parallel size.
        cp: Context-parallel size.
        pp: Pipeline-parallel size.
        ep: Expert-parallel size.
        etp: Expert tensor-parallel size, resolved as Bridge does (1 when ``ep > 1`` and unset, else ``tp``).
        sequence_parallel: Whether activations are split over tp along the sequence.
        position_embedding_type: ``rope``, ``mrope`` (Qwen3-VL), ``learned_absolute``, ``none``...
        num_moe_experts: Experts per MoE layer, or None for a dense model.
        moe_layer_pattern: 1 for an MoE layer, 0 for a dense one, per decoder layer (empty when dense).
        num_layers_in_first_pipeline_stage: Uneven pipeline split, first stage (None: even split).
        num_layers_in_last_pipeline_stage: Uneven pipeline split, last stage (None: even split).
        account_for_embedding_in_pipeline_split: Megatron counts the embedding as a layer of stage 0.
        account_for_loss_in_pipeline_split: Megatron counts the loss as a layer of the last stage.
        has_pipeline_layout: A custom ``pipeline_model_parallel_layout`` is set.
        dtype: Activation dtype name: ``bf16``, ``fp16`` or ``fp32``.
        virtual_pipeline_size: Virtual pipeline stages per rank, or None.
        vision_dp_when_cp: Qwen3-VL splits images over cp ranks (its provider flag).
        cuda_graph_warmup_steps: The model's ``cuda_graph_warmup_steps``: the warmup of a submodule that sets none.
        gradient_accumulation_fusion: The language model's TE layers accumulate weight gradients into ``main_grad``
            in their GEMMs (:mod:`bridge_cudagraph.wgrad_fusion`), graphs or not.
        per_layer_contexts: The provider's settings that wrap or follow each decoder layer on its own in the
            decoder's loop (``fp8``, ``fp4``: a quantization context per layer number; ``cpu_offloading``: a commit
            after each layer): language graphs then span one layer each.
        vision: The vision encoder, or None for a text-only model.
        ffn_hidden_size: MLP width (None: 4 x ``hidden_size``); with the four below, for the memory estimate
            (:mod:`bridge_cudagraph.memory`).
        num_query_groups: Key/value heads (None: as many as attention heads).
        gated_linear_unit: The MLP's first GEMM is gated (SwiGLU: twice ``ffn_hidden_size`` wide).
        vocab_size: Vocabulary rows of the embedding and the output layer (0: unknown).
        share_embeddings_and_output_weights: The output layer reuses the embedding's weights.
        qk_layernorm: Queries and keys are normalised per head (Qwen3): their pre-norm values are saved too.
    """

    provider: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    kv_channels: int
    seq_length: int
    tp: int = 1
    cp: int = 1
    pp: int = 1
    ep: int = 1
    etp: int = 1
    sequence_parallel: bool = False
    position_embedding_type: str = "rope"
    rotary_percent: float = 1.0
    num_moe_experts: int | None = None
    moe_layer_pattern: tuple[int, ...] = ()
    num_layers_in_first_pipeline_stage: int | None = None
    num_layers_in_last_pipeline_stage: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    has_pipeline_layout: bool = False
    dtype: str = "bf16"
    virtual_pipeline_size: int | None = None
    vision_dp_when_cp: bool = False
    cuda_graph_warmup_steps: int = 3
    gradient_accumulation_fusion: bool = False
    per_layer_contexts: tuple[str, ...] = ()
    vision: VisionFacts | None = None
    ffn_hidden_size: int | None = None
    num_query_groups: int | None = None
    gated_linear_unit: bool = False
    vocab_size: int = 0
    share_embeddings_and_output_weights: bool = False
    qk_layernorm: bool = False

    @property
    def rotary_dim(self) -> int:
        """Width of the rotary table each attention layer reads (``kv_channels x rotary_percent``)."""
        return int(self.kv_channels * self.rotary_percent)


def _moe_layer_pattern(freq: Any, num_layers: int, num_experts: int | None) -> tuple[int, ...]:
    """Megatron-Core's ``moe_layer_freq`` as one 0/1 per layer (``transformer_config.py``: an int N means
    every N-th layer starting at 0, a list is given per layer, a string is a Python list expression)."""
    if not num_experts:
        return ()
    if isinstance(freq, str):
        # Megatron-Core evaluates the same string with eval(); allow only the list arithmetic it documents.
        freq = eval(freq, {"__builtins__": {}}, {})
    if isinstance(freq, int):
        return tuple(1 if i % freq == 0 else 0 for i in range(num_layers))
    pattern = tuple(int(x) for x in freq)
    if len(pattern) != num_layers:
        raise CudaGraphConfigError(
            f"model.moe_layer_freq lists {len(pattern)} layers but model.num_layers is {num_layers}; "
            "give one 0/1 entry per layer"
        )
    return pattern


def _dtype_name(provider: Any, mixed_precision: Any) -> str:
    """``bf16``/``fp16``/``fp32``: the ConfigContainer's mixed-precision recipe wins over the provider flags,
    since Bridge copies it onto the model at ``ConfigContainer.validate()``."""
    if isinstance(mixed_precision, str):
        for name in ("bf16", "fp16"):
            if mixed_precision.startswith(name) or f"_{name}" in mixed_precision:
                return name
    elif mixed_precision is not None:
        if getattr(mixed_precision, "bf16", False):
            return "bf16"
        if getattr(mixed_precision, "fp16", False):
            return "fp16"
    if getattr(provider, "bf16", False):
        return "bf16"
    if getattr(provider, "fp16", False):
        return "fp16"
    return "fp32"


def model_facts(provider: Any, *, mixed_precision: Any = None) -> ModelFacts:
    """Read the :class:`ModelFacts` off a Megatron-Bridge provider (GPT-family or Qwen3-VL).

    Only attribute reads, so it works before ``finalize()`` and without a GPU.

    Args:
        provider: A ``GPTModelProvider`` (or subclass, with or without the ``cuda_graph`` block).
        mixed_precision: The ConfigContainer's ``mixed_precision`` (a preset name or config), when known;
            it decides the activation dtype of the static inputs.

    Returns:
        The facts.
    """
    tp = int(provider.tensor_model_parallel_size or 1)
    ep = int(getattr(provider, "expert_model_parallel_size", 1) or 1)
    etp = getattr(provider, "expert_tensor_parallel_size", None)
    if etp is None:
        # Bridge's default (models/transformer_config.py, _set_moe_expert_tensor_parallel_default), applied at
        # finalize(): expert layers scale with ep instead of tp. Megatron-Core alone would use tp.
        etp = 1 if ep > 1 else tp
    num_layers = int(provider.num_layers)
    heads = int(provider.num_attention_heads)
    hidden = int(provider.hidden_size)
    experts = getattr(provider, "num_moe_experts", None)
    vision = None
    vision_config = getattr(provider, "vision_config", None)
    if vision_config is not None:
        vision = VisionFacts(
            depth=int(vision_config.depth),
            hidden_size=int(vision_config.hidden_size),
            num_heads=int(vision_config.num_heads),
            patch_size=int(vision_config.patch_size),
            temporal_patch_size=int(vision_config.temporal_patch_size),
            spatial_merge_size=int(vision_config.spatial_merge_size),
            deepstack_visual_indexes=tuple(getattr(vision_config, "deepstack_visual_indexes", None) or ()),
            num_position_embeddings=getattr(vision_config, "num_position_embeddings", None),
            intermediate_size=getattr(vision_config, "intermediate_size", None),
            out_hidden_size=getattr(vision_config, "out_hidden_size", None),
        )
    return ModelFacts(
        provider=type(provider).__name__,
        num_layers=num_layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        kv_channels=int(getattr(provider, "kv_channels", None) or hidden // heads),
        seq_length=int(provider.seq_length),
        tp=tp,
        cp=int(getattr(provider, "context_parallel_size", 1) or 1),
        pp=int(getattr(provider, "pipeline_model_parallel_size", 1) or 1),
        ep=ep,
        etp=int(etp),
        sequence_parallel=bool(getattr(provider, "sequence_parallel", False)),
        position_embedding_type=str(getattr(provider, "position_embedding_type", "rope")),
        rotary_percent=float(getattr(provider, "rotary_percent", 1.0) or 1.0),
        num_moe_experts=int(experts) if experts else None,
        moe_layer_pattern=_moe_layer_pattern(getattr(provider, "moe_layer_freq", 1), num_layers, experts),
        num_layers_in_first_pipeline_stage=getattr(provider, "num_layers_in_first_pipeline_stage", None),
        num_layers_in_last_pipeline_stage=getattr(provider, "num_layers_in_last_pipeline_stage", None),
        account_for_embedding_in_pipeline_split=bool(
            getattr(provider, "account_for_embedding_in_pipeline_split", False)
        ),
        account_for_loss_in_pipeline_split=bool(getattr(provider, "account_for_loss_in_pipeline_split", False)),
        has_pipeline_layout=getattr(provider, "pipeline_model_parallel_layout", None) is not None,
        dtype=_dtype_name(provider, mixed_precision),
        virtual_pipeline_size=getattr(provider, "virtual_pipeline_model_parallel_size", None),
        vision_dp_when_cp=bool(getattr(provider, "vision_dp_when_cp", False)),
        cuda_graph_warmup_steps=int(getattr(provider, "cuda_graph_warmup_steps", 3)),
        gradient_accumulation_fusion=bool(getattr(provider, "gradient_accumulation_fusion", False)),
        per_layer_contexts=tuple(name for name in PER_LAYER_CONTEXTS if getattr(provider, name, None)),
        vision=vision,
        ffn_hidden_size=_int_or_none(getattr(provider, "ffn_hidden_size", None)),
        num_query_groups=_int_or_none(getattr(provider, "num_query_groups", None)),
        gated_linear_unit=bool(getattr(provider, "gated_linear_unit", False)),
        vocab_size=int(getattr(provider, "vocab_size", 0) or 0),
        share_embeddings_and_output_weights=bool(getattr(provider, "share_embeddings_and_output_weights", False)),
        qk_layernorm=bool(getattr(provider, "qk_layernorm", False)),
    )


def _int_or_none(value: Any) -> int | None:
    return int(value) if value else None


#: Provider settings under which the decoder's loop does something of its own around or after each layer
#: (megatron-core 0.19.2 ``TransformerBlock.forward``, Bridge 0.6.2 ``Qwen3VLTransformerBlock.forward``): a
#: quantization context per layer number, or an offload commit after each layer.
PER_LAYER_CONTEXTS: tuple[str, ...] = ("fp8", "fp4", "cpu_offloading", "fine_grained_activation_offloading")


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

    Data, not text: the capture code allocates (vision) or checks (language, whose buffers megatron-core's helper
    allocates) its buffers against it, and :meth:`describe` renders it for ``bridge-cudagraph plan``.

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
class PackingFacts:
    """How the run's data path packs sequences, read off the ``ConfigContainer``'s dataset
    (:func:`bridge_cudagraph.validation.packing_facts`).

    Attributes:
        mode: ``qwen3_vl_step``: Bridge's Qwen3-VL step packs each micro-batch (``enable_in_batch_packing`` with
            ``defer_in_batch_packing_to_step``): one THD segment per sample, rows padded to the batch's longest,
            and a ``cu_seqlens_q_padded`` of its own.
            ``offline``: GPT SFT offline packing (``enable_offline_packing``, Bridge's ``GPTSFTPackedDataset``): rows
            of ``seq_length`` tokens packed before training, micro-batch 1, static boundaries with
            ``pad_cu_seqlens`` (:func:`bridge_cudagraph.validation.check_offline_packing`).
        fixed_width: Every micro-batch is ``seq_length`` wide (the Qwen3-VL step pads to it with pp > 1 or ep > 1;
            offline-packed rows always are): one budget.
        separate_padded: The batch carries a ``cu_seqlens_q_padded`` of its own (the Qwen3-VL step always; offline
            packing with ``pad_seq_to_mult`` > 1); else none, and TE sees no padding between sequences.
    """

    mode: str
    fixed_width: bool = False
    separate_padded: bool = True


@dataclass(frozen=True, slots=True)
class ImageFacts:
    """The most pixels one image (one video frame) reaches the vision encoder with on the run's data path, read off
    the ``ConfigContainer``'s dataset (:func:`bridge_cudagraph.validation.image_facts`): the processor resizes every
    image to at most ``max_pixels``, so it holds at most ``max_pixels // patch_size**2`` patches, the default of
    ``vision.max_patches_per_image``.

    Attributes:
        max_pixels: The cap, or None where the data path names none that this machine can read.
        source: Where the cap comes from, or why there is none, for the plan (``passed to the processor by
            Bridge's collate, qwen2_5_collate_fn``, ``the dataset names no processor (dataset.hf_processor_path)``).
    """

    max_pixels: int | None
    source: str


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
        max_seqlen: Longest sequence that replays, the static attention ``max_seqlen``.
        separate_padded: The data path hands a ``cu_seqlens_q_padded`` tensor of its own (TE then assumes padding
            between sequences and picks its backend accordingly; the graphs are captured the same way).
        static_inputs: ``(budget, inputs)`` for every budget.
        copies: Graph sets, one per micro-batch a stage keeps in flight (1 without a pipeline).
        offline: The rows come packed from GPT SFT's offline packing (one budget: ``seq_length``), not from the
            Qwen3-VL step.
        sequences_source: Where a derived ``max_sequences`` comes from (empty when the block sets it).
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

    @property
    def layout(self) -> PackedLayout:
        """The static layout the capture and the replay use."""
        return PackedLayout(self.token_budgets, max_sequences=self.max_sequences, max_seqlen=self.max_seqlen)


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
        static_inputs: Captured inputs of every graph (shapes as megatron-core's helper allocates them).
        warmup_steps: Eager steps before capture, resolved (see :func:`_warmups`).
        packed: The packed (THD) graphs when the data path packs, else None (one static BSHD shape).
        graph_unit: What one graph spans, resolved: ``deepstack`` (a run of layers between deepstack merges) or
            ``layer``.
        deepstack_merges: Layers of the first pipeline stage after which Qwen3-VL's decoder adds a deepstack feature
            (its first ``len(deepstack_visual_indexes)`` layers); 0 for GPT. A run never spans one.
        segments_per_stage: The layer ranges ``[start, end)`` of each stage's graphs, in the stage's own layer
            indices (:func:`~bridge_cudagraph.budgets.layer_segments`); the helpers build them the same way.
        warmup_source: The setting a derived ``warmup_steps`` comes from (empty when the block sets it).
        unit_source: Why a derived ``graph_unit`` is ``layer`` (empty when set, or derived as ``deepstack``).
    """

    enabled: bool
    modules: tuple[str, ...] | None
    layers_per_stage: tuple[int, ...]
    captured_per_stage: tuple[int, ...]
    graphs_per_unit: int
    graphs_per_stage: tuple[int, ...]
    static_inputs: tuple[StaticInput, ...]
    warmup_steps: int
    packed: PackedLanguagePlan | None = None
    graph_unit: str = "layer"
    deepstack_merges: int = 0
    segments_per_stage: tuple[tuple[tuple[int, int], ...], ...] = ()
    warmup_source: str = ""
    unit_source: str = ""

    @property
    def graphs(self) -> int:
        """Graphs on the busiest rank."""
        return max(self.graphs_per_stage, default=0)


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
        max_patches_per_image: Most patches of one image (frame) that replay: the static attention ``max_seqlen``
            (unless set: from the data path's max_pixels, at most the largest budget; see ``patches_source``).
        static_inputs: ``(budget, inputs)`` for every budget.
        copies: Independent graph sets, one per micro-batch the first pipeline stage keeps in flight (1 without a
            pipeline; :func:`~bridge_cudagraph.budgets.in_flight_microbatches`).
        graphs: Graphs on each vision rank: ``len(segments) x len(token_budgets) x copies``.
        warmup_steps: Eager steps before capture, resolved (see :func:`_warmups`).
        graph_unit: What one graph spans: ``deepstack`` (the layers up to each deepstack layer) or ``layer``,
            resolved.
        patches_source: Where a derived ``max_patches_per_image`` comes from (empty when the block sets it).
        warmup_source: The setting a derived ``warmup_steps`` comes from (empty when the block sets it).
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
    graph_unit: str = "deepstack"
    patches_source: str = ""
    warmup_source: str = ""

    segments: tuple[tuple[int, int], ...] = ()
    """The layer ranges ``[start, end)`` of one budget's graphs (:func:`~bridge_cudagraph.budgets.layer_segments`)."""

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
        optimizer_host_cache: The step's host caches are on (:mod:`bridge_cudagraph.step_host`: the optimizer's
            per-parameter walks and the gradient finalisation's module walk): on wherever graphs are, unless the
            block turns them off.
        fewer_host_waits: Qwen3-VL's forward without most of its host waits (:mod:`bridge_cudagraph.forward_host`):
            on wherever graphs are on a Qwen3-VL model, unless the block turns it off.
        memory: The busiest rank's memory, estimated (:mod:`bridge_cudagraph.memory`); None where the plan was
            built without the training facts (a plan of the provider alone).
        num_microbatches_source: How a derived ``num_microbatches`` was derived (empty when the block sets it).
        switches_defaulted: The block's switches left null that the plan turns on (``optimizer_host_cache``,
            ``fewer_host_waits``).
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
    optimizer_host_cache: bool = False
    fewer_host_waits: bool = False
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
        """A readable multi-line block for logs and the CLI (at most 119 columns, no trailing newline). A value the
        plan derived says where it came from, in parentheses; one the block sets is printed as it is."""
        f = self.facts
        nmb = "n/a" if self.num_microbatches is None else str(self.num_microbatches)
        if self.num_microbatches_source:
            nmb += f" ({self.num_microbatches_source})"
        gbs = "unset" if self.global_batch_size is None else str(self.global_batch_size)
        lines = [
            f"capture plan: {f.provider} on {plural(self.world_size, 'rank')}, {f.dtype}",
            f"  micro-batch {self.micro_batch_size}, global batch {gbs}, micro-batches per step {nmb}",
            format_layout(list(self.layouts)),
        ]
        lines += _describe_language(self.language, f)
        if self.vision is not None:
            lines += _describe_vision(self.vision, f, self.vision_layout)
        if self.language.enabled or (self.vision is not None and self.vision.enabled):
            lines.append(
                "optimizer: the step's per-parameter and per-module host work cached (same kernels, same step)"
                if self.optimizer_host_cache
                else "optimizer: megatron-core's step as it is (optimizer_host_cache=false)"
            )
            if self.vision is not None:
                lines.append(
                    "forward: mRoPE positions from one host copy, deepstack and image-token merges by index (same "
                    "values, no wait)"
                    if self.fewer_host_waits
                    else "forward: Bridge's Qwen3-VL forward as it is (fewer_host_waits=false)"
                )
            if self.switches_defaulted:
                lines.append(f"  on wherever graphs are (left null): {', '.join(self.switches_defaulted)}")
            lines += _describe_wgrad_accumulation(f, self.vision)
            if self.memory is not None:
                lines += self.memory.describe()
            lines.append(
                f"busiest rank: {plural(self.total_graphs, 'graph')}; a failed capture "
                + ("trains on eagerly (on_capture_error=eager)" if self.on_capture_error == "eager" else "stops")
            )
        return "\n".join(lines)


def plural(count: int, noun: str) -> str:
    """``1 graph``, ``2 graphs``: a count and its noun, for the plan's text."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _joined(head: str, tail: str) -> list[str]:
    """``head, tail`` on one line where it fits 119 columns, else ``tail`` on an indented line of its own."""
    return [f"{head}, {tail}"] if len(head) + len(tail) < 118 else [f"{head},", f"  {tail}"]


def _sourced(text: str, source: str) -> str:
    """``text (source)``, or ``text`` alone for a value the block sets."""
    return f"{text} ({source})" if source else text


def _describe_wgrad_accumulation(facts: ModelFacts, vision: VisionPlan | None) -> list[str]:
    """Where the weight gradients are summed, graphs on and off alike (:mod:`bridge_cudagraph.wgrad_fusion`)."""
    if not facts.gradient_accumulation_fusion:
        lines = ["weight gradients: added to main_grad one parameter at a time (gradient_accumulation_fusion=false)"]
    else:
        lines = ["weight gradients: summed in the language TE layers' GEMMs (the output layer fuses only with APEX)"]
    if vision is not None:
        lines.append("  vision encoder: one at a time, as Bridge builds it (its config leaves the fusion off)")
    return lines


def _modules_text(modules: tuple[str, ...] | None) -> str:
    return "whole layers" if modules is None else "[" + ", ".join(modules) + "]"


def _describe_language(language: LanguagePlan, facts: ModelFacts) -> list[str]:
    if not language.enabled:
        return [f"language: graphs off ({facts.num_layers} layers run eagerly)"]
    stages = language.captured_per_stage
    if len(stages) == 1:
        layers = plural(stages[0], "layer")
        per = "1 graph each (pp 1)"
    else:
        layers = "+".join(map(str, stages)) + f" layers on {len(stages)} stages"
        per = f"{plural(language.graphs_per_unit, 'graph')} each (one per micro-batch)"
    runs = []
    if language.graph_unit == "deepstack":
        units = "+".join(str(len(s)) for s in language.segments_per_stage)
        layers += f" in {units} run" + ("" if units == "1" else "s")
        merges = f"cut after each of the first {language.deepstack_merges} (a deepstack merge follows)"
        # Stage 0 merges the deepstack features; the later stages look alike, the first of them stands for all.
        runs = [
            f"  runs of layers: {_ranges(spans)}"
            + (f" on stage {stage}" if len(stages) > 1 else "")
            + f"; {merges if stage == 0 and language.deepstack_merges else 'nothing runs between the layers'}"
            for stage, spans in enumerate(language.segments_per_stage[:2])
        ]
    elif language.unit_source:
        runs = [f"  one graph per layer (graph_unit null: {language.unit_source})"]
    packed = language.packed
    if packed is not None:
        copies = f" x {packed.copies} in-flight copies" if packed.copies > 1 else ""
        per = f"{plural(len(packed.token_budgets), 'budget')}{copies} each (packed THD)"
    inputs = [s.describe() for s in language.static_inputs]
    head = f"language: {layers} x {per} = {plural(language.graphs, 'graph')} per rank"
    warmup = _sourced(f"capture after {plural(language.warmup_steps, 'step')}", language.warmup_source)
    lines = [*_joined(head, f"{_modules_text(language.modules)}, {warmup}"), *runs]
    if packed is None:
        lines.append("  static inputs: " + inputs[0])
        lines += ["                 " + s for s in inputs[1:]]
        return lines
    budget_lines = ["  budgets [" + ", ".join(map(str, packed.token_budgets)) + "] tokens"]
    if packed.offline:
        budget_lines.append(
            f"    offline-packed rows of S {packed.max_seqlen} (dataset.offline_packing_specs), one per micro-batch"
        )
    elif packed.budgets_derived:
        budget_lines.append(
            f"    derived: mbs {packed.max_tokens // packed.max_seqlen} x S {packed.max_seqlen} = {packed.max_tokens} "
            f"max, {len(packed.token_budgets)} rungs <= 1.25x apart"
            if len(packed.token_budgets) > 1
            else f"    derived: every row padded to S {packed.max_seqlen} (pp > 1 or ep > 1)"
        )
    seqlen = "model.seq_length" if packed.max_seqlen == facts.seq_length else f"S {facts.seq_length} in padded rows"
    lines += [
        *budget_lines,
        "  max sequences per micro-batch "
        + _sourced(str(packed.max_sequences), packed.sequences_source)
        + f", max sequence length {packed.max_seqlen} ({seqlen})",
        "  a micro-batch with more tokens or sequences runs eagerly (counted)",
    ]
    budget, largest = packed.static_inputs[-1]
    lines.append(f"  static inputs at T={budget} (each budget the same with its own T):")
    lines += ["    " + x.describe() for x in largest]
    return lines


def _ranges(segments: tuple[tuple[int, int], ...]) -> str:
    """``((0, 1), (1, 2), (2, 28))`` as ``0, 1, 2-27``."""
    return ", ".join(f"{a}-{b - 1}" if b - a > 1 else f"{a}" for a, b in segments)


def _describe_vision(vision: VisionPlan, facts: ModelFacts, layout: ResolvedLayout | None) -> list[str]:
    assert facts.vision is not None
    v = facts.vision
    if not vision.enabled:
        return [f"vision: graphs off ({vision.depth} layers run eagerly)"]
    budgets = "[" + ", ".join(map(str, vision.token_budgets)) + "]"
    where = ""
    if layout is not None:
        last = layout.rank_offset + layout.size - 1
        where = f" on rank {last}" if layout.size == 1 else f" on ranks {layout.rank_offset}-{last}"
    most = vision.max_patches_per_microbatch
    mbs = most // (facts.seq_length * v.merge_unit)
    budget_line = f"  budgets {budgets} patches"
    if vision.budgets_derived:
        budget_line += (
            f", derived: S {facts.seq_length} x {v.spatial_merge_size}**2 x mbs {mbs} = {most} max, "
            f"{LADDER_STEPS} rungs"
        )
    images_line = f"  max images per micro-batch {vision.max_images_per_microbatch}"
    if vision.images_derived:
        images_line += (
            f", derived: {vision.token_budgets[-1]} // ({v.merge_unit} x {MIN_IMAGE_MERGED_TOKENS}) "
            "(images of >= 4x4 merged tokens)"
        )
    patches = f"  at most {vision.max_patches_per_image} patches per image (the static attention max_seqlen)"
    if vision.patches_source:
        patches = [f"{patches}:", f"    {vision.patches_source}"]
    else:
        patches = [patches]
    copies = f" x {vision.copies} in-flight copies (pipeline stage 0, 1F1B)" if vision.copies > 1 else ""
    if vision.graph_unit == "layer":
        span, spans = plural(vision.depth, "layer"), []
    else:
        span = plural(len(vision.segments), "graph")
        spans = [f"  each budget's graphs span layers {_ranges(vision.segments)} (cut after each deepstack layer)"]
    head = (
        f"vision: {span} x {plural(len(vision.token_budgets), 'budget')}{copies} = "
        f"{plural(vision.graphs, 'graph')} per rank{where}"
    )
    warmup = _sourced(f"capture after {plural(vision.warmup_steps, 'step')}", vision.warmup_source)
    lines = [
        *_joined(head, f"{_modules_text(vision.modules)}, {warmup}"),
        *spans,
        budget_line,
        images_line,
        *patches,
        f"  a micro-batch with more than {vision.token_budgets[-1]} patches or more images runs eagerly (counted)",
    ]
    for budget, inputs in vision.static_inputs:
        lines.append(f"  B={budget}: " + ", ".join(s.describe() for s in inputs))
    return lines


# ------------------------------------------------------------------------------------------ derivation
def _stage_layers(facts: ModelFacts, where: str) -> list[list[int]]:
    """Global decoder-layer indices each pipeline stage builds, as Megatron-Core's ``get_num_layers_to_build``
    and its layer offsets split them."""
    pp, n = facts.pp, facts.num_layers
    if facts.has_pipeline_layout:
        raise CudaGraphConfigError(
            f"{where}.enabled=true with model.pipeline_model_parallel_layout set: the plan cannot place a custom "
            "layout yet; use num_layers_in_first/last_pipeline_stage instead or set the layout to null"
        )
    first, last = facts.num_layers_in_first_pipeline_stage, facts.num_layers_in_last_pipeline_stage
    if pp == 1:
        return [list(range(n))]
    if first is not None or last is not None:
        rest, stages_left = n - (first or 0) - (last or 0), pp - (first is not None) - (last is not None)
        if stages_left and rest % stages_left:
            raise CudaGraphConfigError(
                f"model.num_layers {n} minus the uneven first/last stages leaves {rest} layers for {stages_left} "
                f"middle stages ({rest} % {stages_left} = {rest % stages_left}); change the uneven split"
            )
        counts = [rest // stages_left if stages_left else 0] * pp
        if first is not None:
            counts[0] = first
        if last is not None:
            counts[-1] = last
    else:
        extra = int(facts.account_for_embedding_in_pipeline_split) + int(facts.account_for_loss_in_pipeline_split)
        if (n + extra) % pp:
            raise CudaGraphConfigError(
                f"model.num_layers {n}"
                + (f" + {extra} (embedding/loss counted as layers)" if extra else "")
                + f" is not divisible by model.pipeline_model_parallel_size {pp} "
                f"({n + extra} % {pp} = {(n + extra) % pp}); Megatron needs an even split or an uneven "
                "first/last stage"
            )
        counts = [(n + extra) // pp] * pp
        counts[0] -= int(facts.account_for_embedding_in_pipeline_split)
        counts[-1] -= int(facts.account_for_loss_in_pipeline_split)
    vp = facts.virtual_pipeline_size or 1
    if vp > 1 and len(set(counts)) == 1:
        # Interleaved: chunk c of stage s holds layers [(c * pp + s) * per_chunk, ... + per_chunk).
        per_chunk = counts[0] // vp
        return [[(c * pp + s) * per_chunk + i for c in range(vp) for i in range(per_chunk)] for s in range(pp)]
    offsets = [sum(counts[:s]) for s in range(pp)]
    return [list(range(offsets[s], offsets[s] + counts[s])) for s in range(pp)]


def _graphable(layer: int, facts: ModelFacts, modules: tuple[str, ...] | None) -> bool:
    """Mirror of Megatron-Core's ``_layer_is_graphable`` (``cuda_graphs.py``) for transformer layers."""
    if modules is None or "attn" in modules:
        return True
    is_moe = bool(facts.moe_layer_pattern) and facts.moe_layer_pattern[layer] == 1
    if is_moe:
        return any(m in modules for m in ("moe", "moe_router", "moe_preprocess"))
    return "mlp" in modules


def _language_static_inputs(facts: ModelFacts, mbs: int, modules: tuple[str, ...] | None) -> tuple[StaticInput, ...]:
    """The inputs megatron-core's helper allocates per layer (``module.py`` / ``transformer_layer.py``
    ``get_layer_static_inputs``, ``cuda_graphs.py`` for the rotary table), with the mRoPE table capture adds."""
    s, cp, tp = facts.seq_length, facts.cp, facts.tp
    if facts.sequence_parallel and tp > 1:
        rows, label = s // cp // tp, "S/cp/tp"
    else:
        rows, label = s // cp, "S/cp"
    inputs = [StaticInput("hidden_states", (rows, mbs, facts.hidden_size), facts.dtype, (label, "mbs", "H"))]
    if modules is None or "attn" in modules:
        inputs.append(StaticInput("attention_mask", (mbs, 1, s // cp, s), "bool", ("mbs", "", "S/cp", "S")))
        if facts.position_embedding_type == "mrope":
            # Qwen3VLMultimodalRotaryEmbedding: (S, b, 1, 2 * dim/2) in fp32, sliced along cp (rope.py).
            inputs.append(
                StaticInput(
                    "rotary_pos_emb", (s // cp, mbs, 1, facts.rotary_dim), "fp32", ("S/cp", "mbs", "", ""), "(mRoPE)"
                )
            )
        elif facts.position_embedding_type == "rope":
            # RotaryEmbedding(seq): (S, 1, 1, dim) in fp32, the same for every sample; sliced along cp.
            inputs.append(
                StaticInput("rotary_pos_emb", (s // cp, 1, 1, facts.rotary_dim), "fp32", ("S/cp", "", "", ""))
            )
    return tuple(inputs)


def _vision_static_inputs(vision: VisionFacts, budget: int, cu_length: int, dtype: str) -> tuple[StaticInput, ...]:
    # Qwen3VLVisionModel: hidden_states[:, None] is (B, 1, Hv); the 2-D rotary table is
    # Qwen3VLVisionRotaryEmbedding(head_dim // 2) looked up for (row, col), flattened to head_dim // 2 and
    # repeated twice: (B, 1, 1, Hv / heads) fp32 (vision_model.py, rot_pos_emb and forward).
    return (
        StaticInput("hidden_states", (budget, 1, vision.hidden_size), dtype),
        StaticInput("rotary_pos_emb", (budget, 1, 1, vision.head_dim), "fp32"),
        # The leading 0, one boundary per image frame, the padding's (PackedLayout.cu_seqlens_length).
        StaticInput("cu_seqlens", (cu_length,), "int32"),
    )


def _warmups(cfg: CudaGraphConfig, facts: ModelFacts) -> tuple[tuple[int, str], tuple[int, str]]:
    """Eager steps before each submodule's capture, ``(language, vision)``, each with the setting it comes from
    (empty: the submodule's own ``warmup_steps``): its own ``warmup_steps``, else the model's
    ``cuda_graph_warmup_steps``. The provider's ``finalize()`` copies a set language warmup onto the model
    (Megatron-Core reads it there), so a vision block without one follows the language graphs; resolving that here
    makes the plan the same before and after ``finalize()``."""
    model, source = facts.cuda_graph_warmup_steps, "model.cuda_graph_warmup_steps"
    language = cfg.language.warmup_steps
    if cfg.language.enabled and language is not None:
        model, source = language, "language.warmup_steps"
    vision = cfg.vision.warmup_steps
    return (
        (model, source) if language is None else (language, ""),
        (model, source) if vision is None else (vision, ""),
    )


def _derive_num_microbatches(
    cfg: CudaGraphConfig, *, mbs: int, gbs: int | None, dp: int, needed_by: str | None
) -> int | None:
    """Micro-batches per step: the one derivation (global batch / (micro batch x language dp)); an explicit
    ``num_microbatches`` must agree with it. ``needed_by`` names the setting that needs the count (None: none)."""
    per_step = mbs * dp
    derived = gbs // per_step if gbs is not None and gbs % per_step == 0 else None
    if cfg.num_microbatches is not None:
        if derived is not None and derived != cfg.num_microbatches:
            raise CudaGraphConfigError(
                f"model.cuda_graph.num_microbatches={cfg.num_microbatches} but train.global_batch_size {gbs} / "
                f"(micro batch {mbs} x dp {dp}) = {derived}; set it to {derived} or to null to derive it"
            )
        return cfg.num_microbatches
    if derived is None and needed_by is not None:
        if gbs is None:
            raise CudaGraphConfigError(
                f"{needed_by} needs the number of micro-batches per step, but "
                "train.global_batch_size is unset; set it or model.cuda_graph.num_microbatches"
            )
        raise CudaGraphConfigError(
            f"{needed_by} cannot derive the micro-batches per step: "
            f"train.global_batch_size {gbs} is not divisible by micro batch {mbs} x dp {dp} = {per_step} "
            f"({gbs} % {per_step} = {gbs % per_step}); use a multiple of {per_step} (e.g. "
            f"{per_step * max(1, math.ceil(gbs / per_step))}) or change the world size"
        )
    return derived


def deepstack_merges(facts: ModelFacts) -> int:
    """Layers of the language model's first stage after which Qwen3-VL's decoder adds a deepstack feature: one per
    deepstack layer of the encoder (Bridge 0.6.2 ``Qwen3VLTransformerBlock.forward``, ``l_no in
    range(len(deepstack_visual_embeds))``); 0 for a text-only model."""
    return len(facts.vision.deepstack_visual_indexes) if facts.vision is not None else 0


def _language_unit(cfg: CudaGraphConfig, facts: ModelFacts) -> tuple[str, str]:
    """``model.cuda_graph.language.graph_unit`` resolved: ``deepstack`` (runs of layers) where the decoder's loop
    does nothing of its own between whole dense layers, else ``layer``, with the reason a null one is ``layer``
    (empty otherwise); an explicit ``deepstack`` where it cannot work is refused with the reason and the fix."""
    where = "model.cuda_graph.language.graph_unit"
    asked = cfg.language.graph_unit
    if asked == "layer":
        return "layer", ""
    if cfg.language.modules is not None:  # config.validate refused deepstack with modules
        return "layer", "language.modules captures parts of layers"
    reasons = [
        f"model.{name} is set (the decoder wraps or follows each layer on its own)"
        for name in facts.per_layer_contexts
    ]
    if facts.num_moe_experts:
        reasons.append(f"{facts.provider} has MoE layers (runs of MoE layers are not verified yet)")
    if (facts.virtual_pipeline_size or 1) > 1:
        reasons.append("model.virtual_pipeline_model_parallel_size > 1 (runs inside virtual chunks are not built yet)")
    if not reasons:
        return "deepstack", ""
    if asked == "deepstack":
        raise CudaGraphConfigError(
            f"{where}='deepstack' cannot capture runs of layers here: {reasons[0]}; set it to 'layer' (or null)"
        )
    return "layer", reasons[0]


def _plan_vision(
    cfg: CudaGraphConfig,
    facts: ModelFacts,
    v: VisionFacts,
    *,
    mbs: int,
    num_mb: int | None,
    warmup: tuple[int, str],
    pixels: ImageFacts | None,
) -> VisionPlan:
    where = "model.cuda_graph.vision"
    max_patches = max_patches_per_microbatch(facts.seq_length, mbs, v.spatial_merge_size)
    modules = tuple(cfg.vision.modules) if cfg.vision.modules is not None else None
    if not cfg.vision.enabled:
        return VisionPlan(
            enabled=False,
            depth=v.depth,
            modules=modules,
            token_budgets=(),
            budgets_derived=False,
            max_patches_per_microbatch=max_patches,
            max_images_per_microbatch=0,
            images_derived=False,
            static_inputs=(),
            copies=1,
            graphs=0,
            warmup_steps=warmup[0],
            warmup_source=warmup[1],
        )
    if cfg.vision.token_budgets is None:
        budgets = derive_token_budgets(facts.seq_length, mbs, v.spatial_merge_size)
        derived = True
    else:
        budgets = list(cfg.vision.token_budgets)
        derived = False
        check_token_budgets(budgets, v.spatial_merge_size, where)
    if cfg.vision.max_images_per_microbatch is None:
        images = derive_max_segments(budgets, v.spatial_merge_size)
        images_derived = True
    else:
        images = cfg.vision.max_images_per_microbatch
        images_derived = False
    longest, patches_source = _max_patches_per_image(cfg, v, budgets, pixels)
    cu_length = PackedLayout(tuple(budgets), max_sequences=images, max_seqlen=longest).cu_seqlens_length
    inputs = tuple((b, _vision_static_inputs(v, b, cu_length, facts.dtype)) for b in budgets)
    # Without a pipeline one copy, whatever the count; with one, build_plan has required the count.
    copies = 1 if facts.pp == 1 else in_flight_microbatches(facts.pp, num_mb)
    unit = cfg.vision.graph_unit or "deepstack"
    segments = layer_segments(v.depth, v.deepstack_visual_indexes, unit)
    return VisionPlan(
        enabled=True,
        depth=v.depth,
        modules=modules,
        token_budgets=tuple(budgets),
        budgets_derived=derived,
        max_patches_per_microbatch=max_patches,
        max_images_per_microbatch=images,
        images_derived=images_derived,
        static_inputs=inputs,
        copies=copies,
        graphs=len(segments) * len(budgets) * copies,
        warmup_steps=warmup[0],
        max_patches_per_image=longest,
        graph_unit=unit,
        segments=segments,
        patches_source=patches_source,
        warmup_source=warmup[1],
    )


def _max_patches_per_image(
    cfg: CudaGraphConfig, v: VisionFacts, budgets: list[int], images: ImageFacts | None
) -> tuple[int, str]:
    """``vision.max_patches_per_image`` resolved, with where a derived one comes from (empty when set): what the data
    path's ``max_pixels`` allows one image (``max_pixels // patch_size**2``), at most the largest budget; else the
    largest budget. A set value above the largest budget is refused: such an image runs eagerly anyway."""
    top = budgets[-1]
    given = cfg.vision.max_patches_per_image
    if given is not None:
        if given > top:
            raise CudaGraphConfigError(
                f"model.cuda_graph.vision.max_patches_per_image={given} is above the largest vision budget {top} "
                "(model.cuda_graph.vision.token_budgets): an image that large runs eagerly whatever it says; set it "
                f"to {top} or less (or null), or add a budget of at least {given}"
            )
        return given, ""
    if images is None or images.max_pixels is None:
        return top, "the largest budget; " + (images.source if images is not None else "no data path was read")
    cap = images.max_pixels // v.patch_size**2
    derived = f"max_pixels {images.max_pixels} // {v.patch_size}**2 = {cap}, {images.source}"
    if cap >= top:
        return top, f"the largest budget, below {derived}"
    return cap, f"from {derived}"


def offline_max_sequences(seq_length: int) -> int:
    """The sequences an offline-packed row may hold and replay, when ``max_sequences`` is not given: one per 32
    tokens. Bridge's packer knows the real count only after packing (``max_samples_per_bin``); a larger static
    ``cu_seqlens`` costs zero-length segments only, and a row with more runs eagerly (counted, logged once)."""
    return max(2, seq_length // 32)


def _unpack_fix(packing: PackingFacts) -> str:
    return (
        "set model.cuda_graph.language.enabled=false, or pack no more (dataset.enable_offline_packing=false, "
        "pad_to_max_length=true)"
        if packing.mode == "offline"
        else "pad instead (dataset.enable_in_batch_packing=false, pad_to_max_length=true)"
    )


def check_packed_context_parallel(cp: int, packing: PackingFacts) -> None:
    """Packed language graphs replay one THD sequence per rank, and context parallelism splits each packed row over
    ranks: refused. The one copy, for :func:`build_plan` and for the check before Bridge's finalization
    (:func:`bridge_cudagraph.validation.check_before_bridge`), whose own lines about context parallelism would
    otherwise come first and, once followed, lead to this refusal anyway."""
    if cp <= 1:
        return
    if packing.mode == "offline":
        split = "Bridge's GPT step partitions each packed row over cp ranks by its own boundaries"
    else:
        split = f"Bridge's Qwen3-VL step splits packed rows over cp ranks by index ({cp} ranks x 2 chunks per row)"
    raise CudaGraphConfigError(
        f"model.cuda_graph.language.enabled=true with packed micro-batches and model.context_parallel_size={cp}: "
        f"the packed graphs replay one THD sequence per rank and {split}; set context_parallel_size=1, or "
        f"{_unpack_fix(packing)}"
    )


def _check_padded(cfg: CudaGraphConfig, facts: ModelFacts) -> None:
    """The packed-only settings of the language block on a run whose micro-batches are all padded to ``seq_length``
    (one static shape): refused, not silently ignored."""
    given = [
        f"{name}={value!r}"
        for name, value in (
            ("token_budgets", cfg.language.token_budgets),
            ("max_sequences", cfg.language.max_sequences),
        )
        if value is not None
    ]
    if not given:
        return
    pack = (
        "dataset.enable_in_batch_packing=true with defer_in_batch_packing_to_step=true"
        if facts.vision is not None
        else "dataset.enable_offline_packing=true (GPT SFT)"
    )
    raise CudaGraphConfigError(
        f"model.cuda_graph.language.{' and '.join(given)} {'apply' if len(given) > 1 else 'applies'} to packed "
        f"micro-batches only, but this run pads every micro-batch to model.seq_length {facts.seq_length} (one static "
        f"shape, one graph per layer run); set {'them' if len(given) > 1 else 'it'} to null, or pack: {pack}"
    )


def _plan_packed(
    cfg: CudaGraphConfig, facts: ModelFacts, packing: PackingFacts, *, mbs: int, num_mb: int
) -> PackedLanguagePlan:
    """The packed language graphs' budgets and static shapes, or a refusal with the setting and the fix."""
    where = "model.cuda_graph.language"
    if packing.mode not in ("qwen3_vl_step", "offline"):
        raise CudaGraphConfigError(f"packed language graphs cannot replay the {packing.mode!r} packing path yet")
    offline = packing.mode == "offline"
    unpack = _unpack_fix(packing)
    check_packed_context_parallel(facts.cp, packing)
    if offline and mbs != 1:
        raise CudaGraphConfigError(
            f"train.micro_batch_size={mbs} with dataset.enable_offline_packing=true: Bridge trains offline-packed "
            "rows one per micro-batch; set train.micro_batch_size=1"
        )
    if cfg.language.modules is not None:
        raise CudaGraphConfigError(
            f"{where}.modules={cfg.language.modules} with packed micro-batches: packed graphs capture whole layers "
            "(the attention must see the static cu_seqlens); set modules to null"
        )
    if facts.num_moe_experts:
        raise CudaGraphConfigError(
            f"{where}.enabled=true with packed micro-batches on an MoE model ({facts.num_moe_experts} experts): "
            f"packed graphs of MoE layers are not supported yet; {unpack}"
        )
    tp = facts.tp if facts.sequence_parallel and facts.tp > 1 else 1
    if offline:  # the rows are packed to seq_length before training (check_offline_packing): one budget
        if cfg.language.token_budgets is not None and tuple(cfg.language.token_budgets) != (facts.seq_length,):
            raise CudaGraphConfigError(
                f"{where}.token_budgets={list(cfg.language.token_budgets)} with offline packing: every packed row is "
                f"model.seq_length = {facts.seq_length} tokens wide; set token_budgets to null (or "
                f"[{facts.seq_length}])"
            )
        if facts.seq_length % tp:
            raise CudaGraphConfigError(
                f"model.seq_length={facts.seq_length} with offline packing and sequence parallelism over tp "
                f"{facts.tp}: the packed row is split over the tp ranks; use a seq_length that is a multiple of {tp}"
            )
        max_seqlen = max_tokens = multiple = facts.seq_length
        budgets, derived = (facts.seq_length,), cfg.language.token_budgets is None
    else:
        # Bridge's qwen3_vl_step (_pad_and_pack_qwen3_vl_step, use_fp8_padding=True): rows are padded to a multiple
        # of lcm(tp, 16) at cp 1, so every packed width is micro batch x such a row.
        row = math.lcm(facts.tp, 16)
        max_seqlen = -(-facts.seq_length // row) * row
        max_tokens = mbs * max_seqlen
        multiple = mbs * row
        if cfg.language.token_budgets is not None:
            budgets = tuple(cfg.language.token_budgets)
            derived = False
            bad = [b for b in budgets if b % tp]
            if bad:
                raise CudaGraphConfigError(
                    f"{where}.token_budgets {list(bad)} are not multiples of tp {facts.tp} (sequence parallel splits "
                    f"the static hidden states over tp ranks): use multiples of {tp}, e.g. "
                    f"{[-(-b // tp) * tp for b in bad]}"
                )
        elif packing.fixed_width:
            budgets, derived = (max_tokens,), True
        else:
            budgets, derived = tuple(derive_language_budgets(max_tokens, multiple)), True
    sequences, sequences_source = cfg.language.max_sequences, ""
    if sequences is None:
        sequences = offline_max_sequences(facts.seq_length) if offline else mbs
        sequences_source = f"model.seq_length {facts.seq_length} // 32" if offline else "the micro-batch size"
    layout = PackedLayout(budgets, max_sequences=sequences, max_seqlen=max_seqlen)
    cu = (layout.cu_seqlens_length,)
    # mRoPE has one rotary row per token; RoPE one per position inside a sequence (the fused THD kernel indexes it
    # by position), which the static table holds for every position up to the budget.
    rotary_note = "(mRoPE)" if facts.position_embedding_type == "mrope" else "(RoPE, by position in its sequence)"
    inputs = tuple(
        (
            b,
            (
                StaticInput(
                    "hidden_states", (b // tp, 1, facts.hidden_size), facts.dtype, ("T/tp" if tp > 1 else "T", "", "H")
                ),
                StaticInput("rotary_pos_emb", (b, 1, 1, facts.rotary_dim), "fp32", ("T", "", "", ""), rotary_note),
                StaticInput("cu_seqlens", cu, "int32"),
                *((StaticInput("cu_seqlens_padded", cu, "int32"),) if packing.separate_padded else ()),
            ),
        )
        for b in budgets
    )
    return PackedLanguagePlan(
        token_budgets=budgets,
        budgets_derived=derived,
        max_tokens=max_tokens,
        multiple=multiple,
        max_sequences=sequences,
        max_seqlen=max_seqlen,
        separate_padded=packing.separate_padded,
        offline=offline,
        static_inputs=inputs,
        copies=1 if facts.pp == 1 else in_flight_microbatches(facts.pp, num_mb),
        sequences_source=sequences_source,
    )


def check_model(facts: ModelFacts, cfg: CudaGraphConfig) -> None:
    """The checks of the block against the model that need no world size: the one copy of each, called by
    :func:`build_plan` and by the provider's ``finalize()`` (which must refuse them before a model is built).

    Raises:
        CudaGraphConfigError: Vision graphs or the vision fusion on a model without an encoder, or a virtual
            pipeline with Qwen3-VL.
        LayoutError: The vision tensor-parallel size does not divide the encoder's heads
            (:func:`~bridge_cudagraph.layout.check_vision_heads`, also reached by the group derivation).
    """
    v = facts.vision
    if cfg.vision.enabled and v is None:
        raise CudaGraphConfigError(
            f"model.cuda_graph.vision.enabled=true but {facts.provider} has no vision encoder; set it to false "
            "(vision graphs apply to Qwen3-VL providers)"
        )
    if v is not None and (facts.virtual_pipeline_size or 1) > 1:
        raise CudaGraphConfigError(
            f"model.virtual_pipeline_model_parallel_size={facts.virtual_pipeline_size} with Qwen3-VL: its provider "
            "ignores vp_stage, so a virtual pipeline builds wrong chunks; set it to null"
        )
    if cfg.fewer_host_waits and v is None:
        raise CudaGraphConfigError(
            f"model.cuda_graph.fewer_host_waits=true but {facts.provider} is not Qwen3-VL: it changes Qwen3-VL's "
            "forward (mRoPE positions, deepstack merge); leave it null"
        )
    if v is not None:
        check_vision_heads(cfg.vision.tensor_parallel_size, v.num_heads)


def build_plan(
    facts: ModelFacts,
    cfg: CudaGraphConfig,
    *,
    world_size: int,
    micro_batch_size: int,
    global_batch_size: int | None,
    packing: PackingFacts | None = None,
    training: TrainingFacts | None = None,
    images: ImageFacts | None = None,
) -> CapturePlan:
    """Decide what will be captured, or refuse with an error that names the setting and the fix.

    Args:
        facts: The model (see :func:`model_facts`).
        cfg: The ``model.cuda_graph`` block.
        world_size: Ranks of the job.
        micro_batch_size: ``train.micro_batch_size``.
        global_batch_size: ``train.global_batch_size`` (None when unset).
        packing: How the data path packs (None: every micro-batch padded to ``seq_length``).
        training: What the training setup adds to the weights' memory; None: no memory estimate in the plan.
        images: The most pixels of one image on the run's data path, which ``vision.max_patches_per_image`` defaults
            to (None: unknown, the largest vision budget).

    Returns:
        The plan.

    Raises:
        CudaGraphConfigError: A setting cannot be graphed (the message shows the arithmetic and the fix).
        LayoutError: The parallel sizes do not fit the world size.
    """
    cfg.validate("model.cuda_graph")
    _check_positive("world size", world_size)
    _check_positive("train.micro_batch_size", micro_batch_size)
    if global_batch_size is not None:
        _check_positive("train.global_batch_size", global_batch_size)
    check_model(facts, cfg)
    v = facts.vision
    vision_tp = cfg.vision.tensor_parallel_size
    resolved = resolve_submodules(
        ParallelLayout(tp=facts.tp, cp=facts.cp, pp=facts.pp, ep=facts.ep, etp=facts.etp),
        None
        if v is None
        else VisionLayout(tp=vision_tp, num_attention_heads=v.num_heads, vision_dp_when_cp=facts.vision_dp_when_cp),
        world_size,
    )
    language_layout = resolved[Submodule.LANGUAGE]
    needed_by = None
    if cfg.language.enabled:
        needed_by = "model.cuda_graph.language.enabled=true"
    elif cfg.vision.enabled and facts.pp > 1:
        needed_by = f"model.cuda_graph.vision.enabled=true with pipeline size {facts.pp} (graph copies in flight)"
    num_mb = _derive_num_microbatches(
        cfg, mbs=micro_batch_size, gbs=global_batch_size, dp=language_layout.dp, needed_by=needed_by
    )
    num_mb_source = ""
    if num_mb is not None and cfg.num_microbatches is None:
        num_mb_source = f"{global_batch_size} / ({micro_batch_size} x dp {language_layout.dp})"
    (language_warmup, language_warmup_source), vision_warmup = _warmups(cfg, facts)

    lang = cfg.language
    modules = tuple(lang.modules) if lang.modules is not None else None
    if lang.enabled:
        split = facts.seq_length // facts.cp
        if facts.seq_length % facts.cp or (facts.sequence_parallel and facts.tp > 1 and split % facts.tp):
            by = facts.cp * (facts.tp if facts.sequence_parallel and facts.tp > 1 else 1)
            raise CudaGraphConfigError(
                f"model.seq_length {facts.seq_length} is not divisible by cp {facts.cp}"
                + (f" x tp {facts.tp} (sequence parallel)" if by != facts.cp else "")
                + f" = {by} ({facts.seq_length} % {by} = {facts.seq_length % by}); the static hidden_states need "
                f"equal slices: use a multiple of {by}"
            )
        stages = _stage_layers(facts, "model.cuda_graph.language")
        graphable = [[i for i, layer in enumerate(layers) if _graphable(layer, facts, modules)] for layers in stages]
        captured = tuple(len(local) for local in graphable)
        if not any(captured):
            raise CudaGraphConfigError(
                f"model.cuda_graph.language.modules={list(modules or [])} captures no layer of {facts.provider} "
                f"({'all MoE' if facts.moe_layer_pattern and all(facts.moe_layer_pattern) else 'dense'} layers); "
                "add 'attn' or set modules to null"
            )
        assert num_mb is not None  # needed_by was set
        packed = None
        if packing is not None:
            packed = _plan_packed(cfg, facts, packing, mbs=micro_batch_size, num_mb=num_mb)
            per_unit = len(packed.token_budgets) * packed.copies
        else:
            _check_padded(cfg, facts)
            per_unit = 1 if facts.pp == 1 else num_mb
        unit, unit_source = _language_unit(cfg, facts)
        merges = deepstack_merges(facts)
        segments = tuple(
            language_segments(len(local), merges, first_stage=stage == 0, unit=unit)
            if unit == "deepstack"
            else tuple((i, i + 1) for i in local)
            for stage, local in enumerate(graphable)
        )
        language = LanguagePlan(
            enabled=True,
            modules=modules,
            layers_per_stage=tuple(len(s) for s in stages),
            captured_per_stage=captured,
            graphs_per_unit=per_unit,
            graphs_per_stage=tuple(len(units) * per_unit for units in segments),
            static_inputs=() if packed else _language_static_inputs(facts, micro_batch_size, modules),
            warmup_steps=language_warmup,
            packed=packed,
            graph_unit=unit,
            deepstack_merges=merges,
            segments_per_stage=segments,
            warmup_source=language_warmup_source,
            unit_source=unit_source,
        )
    else:
        language = LanguagePlan(False, modules, (), (), 0, (), (), language_warmup)

    vision = None
    if v is not None:
        vision = _plan_vision(cfg, facts, v, mbs=micro_batch_size, num_mb=num_mb, warmup=vision_warmup, pixels=images)
    host_cache = cfg.any_enabled and cfg.optimizer_host_cache is not False
    fewer_waits = cfg.any_enabled and facts.vision is not None and cfg.fewer_host_waits is not False
    plan = CapturePlan(
        facts=facts,
        world_size=world_size,
        micro_batch_size=micro_batch_size,
        global_batch_size=global_batch_size,
        num_microbatches=num_mb,
        layouts=tuple(resolved.values()),
        language=language,
        vision=vision,
        on_capture_error=cfg.on_capture_error,
        optimizer_host_cache=host_cache,
        fewer_host_waits=fewer_waits,
        num_microbatches_source=num_mb_source,
        switches_defaulted=tuple(
            name
            for name, on in (("optimizer_host_cache", host_cache), ("fewer_host_waits", fewer_waits))
            if on and getattr(cfg, name) is None
        ),
    )
    if training is None:
        return plan
    return dataclasses.replace(plan, memory=estimate(plan, training))


def plan_for(provider: Any, *, world_size: int, micro_batch_size: int, num_microbatches: int) -> CapturePlan:
    """The plan of a provider a caller builds a model from itself (a test, the benchmark), without a
    ``ConfigContainer``: its own facts and block, with the micro-batch count the caller's schedule runs.

    A run from a recipe plans through :func:`bridge_cudagraph.planning.plan_config` instead, which also finalizes
    the config and runs the run-level checks.
    """
    cfg = dataclasses.replace(provider.cuda_graph, num_microbatches=num_microbatches)
    return build_plan(
        model_facts(provider), cfg, world_size=world_size, micro_batch_size=micro_batch_size, global_batch_size=None
    )
