"""What a provider and a Bridge config say, as plain numbers: the inputs of the plan.
 :class:`ModelFacts` (read off a provider by :func:`model_facts`), :class:`PackingFacts` (how the data path packs,
:func:`packing_facts`) and :class:`ImageFacts` (what the data path allows an image, :func:`image_facts`). Reading them
is the only place the plan touches Bridge objects; everything downstream is pure arithmetic, so the CLI plans 64 GPUs
on a laptop and the unit tests cover it with plain integers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bridge_cudagraph.config import CudaGraphConfigError


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
            in their GEMMs (:mod:`bridge_cudagraph.host.wgrad_fusion`), graphs or not.
        per_layer_contexts: The provider's settings that wrap or follow each decoder layer on its own in the
            decoder's loop (``fp8``, ``fp4``: a quantization context per layer number; ``cpu_offloading``: a commit
            after each layer): language graphs then span one layer each.
        vision: The vision encoder, or None for a text-only model.
        ffn_hidden_size: MLP width (None: 4 x ``hidden_size``); with the four below, for the memory estimate
            (:mod:`bridge_cudagraph.plan.memory`).
        num_query_groups: Key/value heads (None: as many as attention heads).
        gated_linear_unit: The MLP's first GEMM is gated (SwiGLU: twice ``ffn_hidden_size`` wide).
        vocab_size: Vocabulary rows of the embedding and the output layer (0: unknown).
        share_embeddings_and_output_weights: The output layer reuses the embedding's weights.
        qk_layernorm: Queries and keys are normalised per head (Qwen3): their pre-norm values are saved too.
        linear_attention_pattern: 1 for a linear-attention layer (megatron-core's ``GatedDeltaNet``, Qwen3.5's
            ``experimental_attention_variant="gated_delta_net"``), 0 for a standard attention layer, per decoder
            layer, as megatron-core's ``get_linear_attention_pattern`` builds the block (empty when every layer is
            standard attention).
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
    linear_attention_pattern: tuple[int, ...] = ()

    @property
    def sequence_split(self) -> int:
        """The tensor-parallel ranks each language layer's sequence is cut over: ``tp`` under sequence parallelism
        (each rank holds ``1/tp`` of the rows), else 1."""
        return self.tp if self.sequence_parallel else 1

    @property
    def rotary_dim(self) -> int:
        """Width of the rotary table each attention layer reads (``kv_channels x rotary_percent``)."""
        return int(self.kv_channels * self.rotary_percent)

    @property
    def linear_attention_layers(self) -> tuple[int, ...]:
        """The decoder layers (0-based, whole model) that are linear-attention (gated-delta-net) layers."""
        return tuple(i for i, linear in enumerate(self.linear_attention_pattern) if linear)


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
        linear_attention_pattern=_linear_attention_pattern(provider),
    )


def _linear_attention_pattern(provider: Any) -> tuple[int, ...]:
    """Which decoder layers are linear attention, read by megatron-core's own ``get_linear_attention_pattern``
    (``experimental_attention_variant_module_specs.py``: ``linear_attention_freq`` N puts one standard attention
    layer after every N-1 linear ones, a list is given per layer); empty for a model without a linear-attention
    variant."""
    from megatron.core.models.gpt.experimental_attention_variant_module_specs import (
        get_linear_attention_pattern,
        is_linear_attention_variant,
    )

    if not is_linear_attention_variant(getattr(provider, "experimental_attention_variant", None)):
        return ()
    try:
        pattern = get_linear_attention_pattern(provider)
    except (AssertionError, ValueError) as error:
        raise CudaGraphConfigError(
            f"model.linear_attention_freq={getattr(provider, 'linear_attention_freq', None)!r} does not give one "
            f"attention kind per layer of model.num_layers={provider.num_layers} ({error}); give an int N (one "
            "standard attention layer every N) or one 0/1 per layer"
        ) from error
    return tuple(int(x) for x in pattern)


def _int_or_none(value: Any) -> int | None:
    return int(value) if value else None


#: Provider settings under which the decoder's loop does something of its own around or after each layer
#: (megatron-core 0.19.2 ``TransformerBlock.forward``, Bridge 0.6.2 ``Qwen3VLTransformerBlock.forward``): a
#: quantization context per layer number, or an offload commit after each layer.
PER_LAYER_CONTEXTS: tuple[str, ...] = ("fp8", "fp4", "cpu_offloading", "fine_grained_activation_offloading")


@dataclass(frozen=True, slots=True)
class PackingFacts:
    """How the run's data path packs sequences, read off the ``ConfigContainer``'s dataset
    (:func:`bridge_cudagraph.plan.facts.packing_facts`).

    Attributes:
        mode: ``qwen3_vl_step``: Bridge's Qwen3-VL step packs each micro-batch (``enable_in_batch_packing`` with
            ``defer_in_batch_packing_to_step``): one THD segment per sample, rows padded to the batch's longest, and a
            ``cu_seqlens_q_padded`` of its own. ``offline``: GPT SFT offline packing (``enable_offline_packing``,
            Bridge's ``GPTSFTPackedDataset``): rows of ``seq_length`` tokens packed before training, micro-batch 1,
            static boundaries with ``pad_cu_seqlens`` (:func:`bridge_cudagraph.plan.checks.check_offline_packing`).
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
    the ``ConfigContainer``'s dataset (:func:`bridge_cudagraph.plan.facts.image_facts`): the processor resizes every
    image to at most ``max_pixels``, so it holds at most ``max_pixels // patch_size**2`` patches, the default of
    ``vision.max_patches_per_image``.

    Attributes:
        max_pixels: The cap, or None where the data path names none that this machine can read.
        source: Where the cap comes from, or why there is none, for the plan (``passed to the processor by
            Bridge's collate, qwen2_5_collate_fn``, ``the dataset names no processor (dataset.hf_processor_path)``).
        min_pixels: The floor the same collate resizes every image up to (Bridge's ``QWEN_VL_MIN_PIXELS`` = 200704,
            448 x 448), or None where none is known: no image holds fewer than ``min_pixels // patch_size**2``
            patches.
    """

    max_pixels: int | None
    source: str
    min_pixels: int | None = None

    def smallest_patches(self, patch_size: int) -> int:
        """The patches of the smallest image the data path hands the encoder, ``min_pixels // patch_size**2``; 0 where
        no floor is known."""
        return self.min_pixels // patch_size**2 if self.min_pixels else 0


def packing_facts(config: Any) -> PackingFacts | None:
    """How the run's data path packs sequences, or None when every micro-batch is padded to ``seq_length``.

    The one reading of the dataset's packing switches (Bridge 0.6.2 ``training/config.py``, ``qwen3_vl_step``):
    ``enable_in_batch_packing`` with ``defer_in_batch_packing_to_step`` is Bridge's Qwen3-VL fine-tuning default,
    packed by the step; collate-time packing (``vlm_step``, ``gpt_step``) and GPT SFT offline packing are other
    paths. Which of them language graphs can replay is :func:`check_run`'s decision.
    """
    dataset, model = getattr(config, "dataset", None), config.model
    if getattr(dataset, "enable_offline_packing", False):
        specs = getattr(dataset, "offline_packing_specs", None)
        # pad_seq_to_mult > 1 gives the batch a cu_seqlens_q_padded of its own (Bridge's GPTSFTPackedDataset)
        return PackingFacts(
            "offline", fixed_width=True, separate_padded=(getattr(specs, "pad_seq_to_mult", 1) or 1) > 1
        )
    if not getattr(dataset, "enable_in_batch_packing", False):
        return None
    if not getattr(dataset, "defer_in_batch_packing_to_step", False):
        return PackingFacts("collate")
    fixed = (getattr(model, "pipeline_model_parallel_size", 1) or 1) > 1 or (
        getattr(model, "expert_model_parallel_size", 1) or 1
    ) > 1
    return PackingFacts("qwen3_vl_step", fixed_width=fixed)


# --------------------------------------------------------------------------------------- the data path's images
#: Where Bridge's processors keep their class name, in a processor folder.
_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
#: The processor of a Qwen3-VL checkpoint (its ``preprocessor_config.json``), for a folder not on this machine.
_QWEN3_VL_PROCESSOR = "Qwen3VLProcessor"


def image_facts(config: Any) -> ImageFacts:
    """The most pixels one image reaches the vision encoder with on the run's data path
    (:class:`~bridge_cudagraph.plan.facts.ImageFacts`, the default of ``vision.max_patches_per_image``), read off the
    dataset config and what it names, and where the number comes from:

    1. an Energon task encoder's own ``max_pixels`` (``dataset.task_encoder.max_pixels``);
    2. else the ``max_pixels`` Bridge's collate for the processor passes it with ``min_pixels`` (its signature's
       defaults; transformers 5 resizes to them only when both are given): Bridge 0.6.2 picks the collate by the
       processor's class (``data/collators/registry.py``), ``qwen2_5_collate_fn`` for Qwen2.5-VL and Qwen3-VL
       processors, whose default is ``QWEN_VL_MAX_PIXELS`` = 1003520 (``models/qwen_vl/data/collate_fn.py``); the
       class is read from the processor folder (``dataset.hf_processor_path``, a local folder or the Hugging Face
       cache), else taken to be a Qwen3-VL checkpoint's;
    3. else the processor's own ``size.longest_edge`` (or ``max_pixels``) in its ``preprocessor_config.json``.

    Reads files only; ``max_pixels`` is None where the dataset names no processor or none of these is readable.
    """
    dataset = getattr(config, "dataset", None)
    encoder = getattr(dataset, "task_encoder", None)
    given = getattr(encoder, "max_pixels", None)
    if _is_count(given):
        return ImageFacts(given, "dataset.task_encoder.max_pixels")
    path = getattr(encoder, "hf_processor_path", None) or getattr(dataset, "hf_processor_path", None)
    if not path:
        return ImageFacts(None, "the dataset names no processor (dataset.hf_processor_path)")
    settings = _processor_settings(str(path))
    kind = next((settings[f].get("processor_class") for f in _PROCESSOR_FILES if f in settings), None)
    collate, max_pixels, min_pixels = _collate_pixels(kind or _QWEN3_VL_PROCESSOR)
    if max_pixels is not None:
        return ImageFacts(max_pixels, f"passed to the processor by Bridge's collate, {collate}", min_pixels)
    own = settings.get("preprocessor_config.json", {})
    size = own.get("size")
    if not isinstance(size, dict):
        size = {}
    longest = size.get("longest_edge", own.get("max_pixels"))
    if _is_count(longest):
        return ImageFacts(longest, f"size.longest_edge of {path}'s preprocessor_config.json")
    return ImageFacts(None, f"no max_pixels in reach: {path} has no readable preprocessor_config.json here")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _processor_settings(path: str) -> dict[str, dict[str, Any]]:
    """The JSON files of :data:`_PROCESSOR_FILES` that a processor folder holds on this machine: a local folder, or
    a Hugging Face model id in the local cache (never the network)."""
    import json
    from pathlib import Path

    found: dict[str, dict[str, Any]] = {}
    for name in _PROCESSOR_FILES:
        file: Any = Path(path) / name
        if not file.is_file():
            try:
                from huggingface_hub import try_to_load_from_cache

                file = try_to_load_from_cache(path, name)
            except Exception:  # not a model id, or no hub library: nothing cached
                file = None
            file = Path(file) if isinstance(file, str) else None
        if file is None or not file.is_file():
            continue
        try:
            data = json.loads(file.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            found[name] = data
    return found


def _collate_pixels(processor_class: str) -> tuple[str, int | None, int | None]:
    """The collate Bridge picks for a processor class, and the ``max_pixels`` and ``min_pixels`` it resizes images
    to (None where it passes none, or not both: transformers 5 resizes to them only when both are given)."""
    import inspect

    try:
        from megatron.bridge.data.collators.registry import resolve_model_collate

        collate = resolve_model_collate(processor_class)
        parameters = inspect.signature(collate).parameters
    except (ImportError, ValueError, TypeError):
        return "", None, None
    name = getattr(collate, "__name__", str(collate))
    bounds = [parameters[p].default if p in parameters else None for p in ("min_pixels", "max_pixels")]
    if not all(_is_count(b) for b in bounds):
        return name, None, None
    return name, bounds[1], bounds[0]
