"""Run-level checks: settings outside the model provider that make static-shape graphs impossible or unsafe.

The provider's own ``finalize()`` (:mod:`bridge_cudagraph.bridge.mixin`) checks the model; this looks at the rest of a
Bridge ``ConfigContainer`` (data loading, packing, environment) before any process group or GPU work, so a bad
run fails at config time with the setting and the fix, not with a shape error from TE at step N.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

from bridge_cudagraph.config import FORWARD_PARTS, CudaGraphConfig, CudaGraphConfigError
from bridge_cudagraph.parallel.layout import check_vision_heads
from bridge_cudagraph.plan.budgets import check_token_budgets
from bridge_cudagraph.plan.facts import packing_facts

if TYPE_CHECKING:
    from bridge_cudagraph.plan.facts import ModelFacts, PackingFacts


#: The variables torch reads its caching allocator's settings from: ``PYTORCH_ALLOC_CONF`` (torch 2.9 and later) and
#: its former name, still read.
ALLOC_CONF_VARIABLES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def expandable_segments_on(value: str) -> bool:
    """Whether an allocator setting string turns ``expandable_segments`` on, as torch parses it: comma-separated
    ``key:value`` pairs, spaces around them ignored (torch takes ``True`` or ``False`` only)."""
    for item in value.split(","):
        key, _, setting = item.partition(":")
        if key.strip() == "expandable_segments" and setting.strip() == "True":
            return True
    return False


def check_environment(environ: dict[str, str] | None = None) -> None:
    """``expandable_segments`` makes NCCL's graph registration read freed memory unless it is disabled
    (megatron-core asserts this only when the helper is built, i.e. at the capture step), under either name of
    torch's allocator variable (:data:`ALLOC_CONF_VARIABLES`)."""
    env = os.environ if environ is None else environ
    if env.get("NCCL_GRAPH_REGISTER") == "0":
        return
    for name in ALLOC_CONF_VARIABLES:
        if expandable_segments_on(env.get(name, "")):
            raise CudaGraphConfigError(
                f"{name}={env[name]} turns expandable_segments on, which with CUDA graphs needs NCCL_GRAPH_REGISTER=0 "
                f"(else illegal memory accesses); export NCCL_GRAPH_REGISTER=0 or drop expandable_segments from {name}"
            )


def check_stack(config: Any) -> None:
    """What this machine's installed stack cannot build, whatever the graphs: checked by ``train`` (after the plan,
    so a configuration error keeps ``validate``'s line) and by the random base builder, before any model exists;
    ``validate`` and ``plan`` may run for another machine and leave it out.

    ``model.gradient_accumulation_fusion=true`` without APEX on a provider that is not this plugin's: Bridge enables
    it whenever Transformer Engine imports, but megatron-core's non-TE output layer then raises deep inside model
    construction (see :func:`bridge_cudagraph.host.compat.apex_gradient_accumulation_fusion_available`). This plugin's
    providers build it (TE's layers fuse, :mod:`bridge_cudagraph.host.wgrad_fusion`). Linear-attention layers without
    their kernels: :func:`check_linear_attention_kernels`."""
    from bridge_cudagraph.host.wgrad_fusion import fuses_te_layers_only

    # Read off the class (the mixin's ClassVar), not by importing the mixin: it imports this module.
    if fuses_te_layers_only(config.model) and not getattr(config.model, "fuses_te_layers_without_apex", False):
        raise CudaGraphConfigError(
            "model.gradient_accumulation_fusion=true needs APEX's fused_weight_gradient_mlp_cuda extension "
            "(megatron-core's output layer, a ColumnParallelLinear, refuses to build without it), which this "
            "machine lacks (Bridge turns the fusion on whenever Transformer Engine imports); set "
            "model.gradient_accumulation_fusion=false, build the model with a bridge_cudagraph provider (its "
            "Transformer Engine layers fuse without APEX), or install APEX with its CUDA extensions"
        )
    check_linear_attention_kernels(config.model)


def check_linear_attention_kernels(model: Any) -> None:
    """A model with linear-attention layers (``model.experimental_attention_variant="gated_delta_net"``, Qwen3.5)
    on a stack without flash-linear-attention: megatron-core's ``GatedDeltaNet`` raises ``ImportError`` at
    construction (:func:`bridge_cudagraph.host.compat.linear_attention_kernels_available`), graphs or not; or on a
    machine whose FLA refuses the layers' backward at the first step
    (:func:`bridge_cudagraph.host.compat.machine_linear_attention_backward_refusal`). Part of :func:`check_stack`,
    since ``validate`` and ``plan`` may run for another machine."""
    from bridge_cudagraph.host.compat import (
        linear_attention_kernels_available,
        machine_linear_attention_backward_refusal,
    )

    variant = getattr(model, "experimental_attention_variant", None)
    if variant != "gated_delta_net":
        return
    if not linear_attention_kernels_available():
        raise CudaGraphConfigError(
            f"model.experimental_attention_variant='{variant}' builds megatron-core's GatedDeltaNet layers, whose "
            "kernels come from flash-linear-attention (import name fla), which this machine lacks (megatron-core "
            "raises ImportError at construction); install flash-linear-attention"
        )
    # Deterministic mode runs megatron-core's torch gated delta rule, not FLA's chunked kernels.
    refusal = None if getattr(model, "deterministic_mode", False) else machine_linear_attention_backward_refusal()
    if refusal:
        raise CudaGraphConfigError(
            f"model.experimental_attention_variant='{variant}' trains megatron-core's GatedDeltaNet layers on "
            f"flash-linear-attention's kernels, and {refusal}; install tilelang (FLA's TileLang backend takes that "
            "kernel) or Triton >= 3.7.1, or set model.deterministic_mode=true (megatron-core's torch gated delta "
            "rule: padded micro-batches only)"
        )


def check_run(config: Any) -> PackingFacts | None:
    """Check a Bridge ``ConfigContainer`` whose model carries a ``cuda_graph`` block with graphs on; returns how its
    data path packs (for the plan), None when it pads. :func:`check_decentralized` runs first, graphs or not."""
    check_decentralized(config)
    model = config.model
    cg = getattr(model, "cuda_graph", None)
    if cg is None or not cg.any_enabled:
        return None
    check_environment()
    check_optimizer_graph(config)
    train, dataset = getattr(config, "train", None), getattr(config, "dataset", None)
    packing = packing_facts(config)
    if not cg.language.enabled:
        return packing
    if packing is not None and packing.mode == "offline":
        check_offline_packing(config)
        return packing
    loader = getattr(dataset, "dataloader_type", None) or getattr(train, "dataloader_type", None)
    if loader == "batch":
        raise CudaGraphConfigError(
            "dataset.dataloader_type='batch' gives every step its own sequence length, but language graphs have "
            "static shapes; use dataloader_type 'single' or 'cyclic'",
            fix=("dataset.dataloader_type=cyclic",),
        )
    if packing is not None and packing.mode == "collate":
        raise CudaGraphConfigError(
            "dataset.enable_in_batch_packing=true with collate-time packing (defer_in_batch_packing_to_step=false) "
            "is a packing path language graphs cannot replay yet (packed graphs follow Bridge's Qwen3-VL step, "
            "enable_in_batch_packing=true with defer_in_batch_packing_to_step=true, and GPT SFT offline packing); "
            "pad instead (dataset.pad_to_max_length=true, no packing) or set model.cuda_graph.language.enabled=false",
            fix=("model.cuda_graph.language.enabled=false",),
        )
    if packing is not None and not model.has_vision_encoder():
        raise CudaGraphConfigError(
            f"dataset.defer_in_batch_packing_to_step=true packs in Bridge's Qwen3-VL step, but {type(model).__name__} "
            "trains with gpt_step, which does not pack there; use a Qwen3-VL provider, or pad "
            "(dataset.enable_in_batch_packing=false, pad_to_max_length=true)"
        )
    if packing is None and getattr(dataset, "pad_to_max_length", True) is False:
        raise CudaGraphConfigError(
            "dataset.pad_to_max_length=false lets sequence lengths vary per batch; unpacked language graphs need "
            "every micro-batch at model.seq_length: set dataset.pad_to_max_length=true, or pack as Bridge's Qwen3-VL "
            "recipes do (enable_in_batch_packing=true, defer_in_batch_packing_to_step=true) for packed graphs",
            fix=("dataset.pad_to_max_length=true",),
        )
    seq = getattr(dataset, "seq_length", None) or getattr(dataset, "sequence_length", None)
    if seq is not None and seq != model.seq_length:
        raise CudaGraphConfigError(
            f"dataset sequence length {seq} != model.seq_length {model.seq_length}: the graphs are captured at "
            "model.seq_length; make them equal"
        )
    return packing


def check_decentralized(config: Any) -> None:
    """Under pure M4 (``dist.use_decentralized_pg=true``, every example recipe) ``parallel_state`` is never
    initialised; refuse the settings whose host paths still read it, graphs or not (a sweep of
    megatron-core 0.19.2 and Bridge 0.6.2; MoE metric logging is completed instead, ``host.gtp_remat_aliases``):

    * ``model.mtp_num_layers``: multi-token prediction asks ``parallel_state`` for its stage and its loss-averaging
      group (``multi_token_prediction.py``);
    * ``dist.distributed_timeout_seconds_after_init``: Bridge applies it to ``parallel_state``'s list of groups
      (``train.py``, ``update_pg_timeout``), empty under pure M4: no group would get the timeout;
    * GTP_remat above 1: Bridge builds no GTP_remat group (``initialize.py``) and ``finalize_model_grads``
      takes them from ``parallel_state`` (``finalize_model_grads.py``).
    """
    dist = getattr(config, "dist", None)
    if not getattr(dist, "use_decentralized_pg", False):
        return
    model, why = config.model, "with dist.use_decentralized_pg=true (no parallel_state groups): "
    mtp = getattr(model, "mtp_num_layers", None)
    if mtp:
        raise CudaGraphConfigError(
            f"model.mtp_num_layers={mtp} {why}megatron-core's multi-token prediction reads parallel_state's "
            "pipeline stage and data-parallel group; set model.mtp_num_layers=null or dist.use_decentralized_pg=false",
            fix=("model.mtp_num_layers=null",),
        )
    timeout = getattr(dist, "distributed_timeout_seconds_after_init", None)
    if timeout is not None:
        raise CudaGraphConfigError(
            f"dist.distributed_timeout_seconds_after_init={timeout} {why}Bridge applies it to parallel_state's group "
            "list, which is empty, so no group would get it; set it to null or dist.use_decentralized_pg=false",
            fix=("dist.distributed_timeout_seconds_after_init=null",),
        )
    for prefix in ("", "expert_"):
        size = getattr(model, f"{prefix}gtp_weight_remat_size", 1) or 1
        if size > 1:
            raise CudaGraphConfigError(
                f"model.{prefix}gtp_weight_remat_size={size} {why}Bridge builds no GTP_remat groups and megatron-core "
                f"reduces the gradients over parallel_state's; set model.{prefix}tensor_parallel_num_weight_shards "
                "to null (GTP_remat 1) or dist.use_decentralized_pg=false",
                fix=(f"model.{prefix}tensor_parallel_num_weight_shards=null",),
            )


def check_offline_packing(config: Any) -> None:
    """GPT SFT offline packing (``dataset.enable_offline_packing``) under packed language graphs: every packed row
    is ``seq_length`` wide, so one graph set replays them all, provided the rest of each micro-batch is static too
    (Bridge 0.6.2 ``data/packing/gpt_sft.py`` ``collate_fn``, ``training/gpt_step.py``,
    megatron-core 0.19.2 ``models/common/embeddings/rope_utils.py``):

    * ``offline_packing_specs.pad_cu_seqlens=true`` (with ``pad_to_max_length``): the boundaries then have one
      length for every row, and the batch's ``max_seqlen`` is one value; without it both vary per row;
    * ``model.apply_rope_fusion=true`` for RoPE: the unfused THD rotary path splits the sequence on the host
      (``cu_seqlens.tolist()``), which a graph cannot hold; TE's fused kernel reads ``cu_seqlens`` on the GPU;
    * the packed width is ``model.seq_length`` (the graphs' one budget); no vision encoder (Bridge's VLM recipes
      pack in the step instead).
    """
    dataset, model = config.dataset, config.model
    specs = getattr(dataset, "offline_packing_specs", None)
    kwargs = getattr(dataset, "dataset_kwargs", None) or {}
    pad_to_max = getattr(dataset, "pad_to_max_length", False) is True or kwargs.get("pad_to_max_length") is True
    if not (getattr(specs, "pad_cu_seqlens", False) and pad_to_max):
        raise CudaGraphConfigError(
            "dataset.enable_offline_packing=true with language graphs needs static packed rows: set "
            "dataset.offline_packing_specs.pad_cu_seqlens=true and dataset.dataset_kwargs.pad_to_max_length=true "
            "(every row seq_length wide, every cu_seqlens one length), or set model.cuda_graph.language.enabled=false",
            fix=("model.cuda_graph.language.enabled=false",),
        )
    if getattr(model, "position_embedding_type", "rope") == "rope" and not getattr(model, "apply_rope_fusion", False):
        raise CudaGraphConfigError(
            "dataset.enable_offline_packing=true with language graphs and model.apply_rope_fusion=false: "
            "megatron-core applies RoPE to packed sequences by splitting them on the host (cu_seqlens.tolist()), "
            "which a CUDA graph cannot hold; set model.apply_rope_fusion=true (Transformer Engine's fused kernel "
            "reads cu_seqlens on the GPU)",
            fix=("model.apply_rope_fusion=true",),
        )
    size = getattr(specs, "packed_sequence_size", -1)
    if size != model.seq_length:
        raise CudaGraphConfigError(
            f"dataset.offline_packing_specs.packed_sequence_size={size} != model.seq_length {model.seq_length}: the "
            "packed graphs capture rows of model.seq_length tokens; make them equal"
        )
    if model.has_vision_encoder():
        raise CudaGraphConfigError(
            f"dataset.enable_offline_packing=true on {type(model).__name__}: offline packing is GPT SFT's text path; "
            "Qwen3-VL packs in its step (dataset.enable_in_batch_packing=true, defer_in_batch_packing_to_step=true)"
        )


def check_optimizer_graph(config: Any) -> None:
    """Bridge's optimizer CUDA graph (``optimizer.optimizer_cuda_graph=true``: megatron-core's
    ``OptimizerCudaGraphWrapper`` around the step, TE ``FusedAdam(capturable=True)``) next to ours: refuse the
    settings it silently gets wrong or cannot capture (megatron-core 0.19.2, TE 2.20, read in their source):

    * a weight decay that changes: FusedAdam passes ``group["weight_decay"]`` to its kernel as a Python float
      (``fused_adam.py`` ``apply_multi_tensor_adam``), so the graph keeps the capture step's value while the
      scheduler (``optimizer_param_scheduler.py`` ``step``) moves it; the learning rate is a device tensor the
      scheduler fills in place and stays live;
    * fp16: the loss scaler's ``found_inf.item()`` (``optimizer.py`` ``_unscale_main_grads_and_check_for_nan``)
      syncs with the host inside the capture;
    * a finite ``grad_norm_skip_threshold``: the step compares the grad norm on the host, inside the capture, and the
      wrapper returns the capture step's ``update_successful`` for every replay.
    """
    optimizer = getattr(config, "optimizer", None)
    if not getattr(optimizer, "optimizer_cuda_graph", False):
        return
    fix = "or set optimizer.optimizer_cuda_graph=false"
    scheduler = getattr(config, "scheduler", None)
    style = getattr(scheduler, "weight_decay_incr_style", "constant")
    start = getattr(scheduler, "start_weight_decay", None)
    end = getattr(scheduler, "end_weight_decay", None)
    if style != "constant" and start is not None and end is not None and start != end:
        raise CudaGraphConfigError(
            f"optimizer.optimizer_cuda_graph=true freezes the weight decay at capture (TE FusedAdam takes it as a "
            f"kernel argument), but scheduler.weight_decay_incr_style='{style}' moves it from {start} to {end}; "
            f"set scheduler.weight_decay_incr_style=constant (start_weight_decay = end_weight_decay) {fix}",
            fix=("scheduler.weight_decay_incr_style=constant",),
        )
    if getattr(optimizer, "fp16", False):
        raise CudaGraphConfigError(
            "optimizer.optimizer_cuda_graph=true cannot capture an fp16 step (the loss scaler reads found_inf on the "
            f"host); train in bf16 (mixed_precision=bf16_mixed) {fix}",
            fix=("optimizer.optimizer_cuda_graph=false",),
        )
    threshold = getattr(optimizer, "grad_norm_skip_threshold", float("inf"))
    # megatron-core skips only under a finite threshold (optimizer.py, ChainedOptimizer.step: math.isfinite); inf,
    # -inf and NaN all mean no skip test, nothing the capture could freeze.
    if threshold is not None and math.isfinite(threshold):
        raise CudaGraphConfigError(
            f"optimizer.optimizer_cuda_graph=true with optimizer.grad_norm_skip_threshold={threshold}: the skip "
            "test reads the grad norm on the host inside the capture, and every replay reports the capture step's "
            f"outcome; set optimizer.grad_norm_skip_threshold=inf {fix}",
            fix=("optimizer.optimizer_cuda_graph=false",),
        )


def check_can_train_with_graphs(config: Any) -> None:
    """``train`` with graphs needs a CUDA device; say so before any import of the heavy stack."""
    import torch

    cg = getattr(config.model, "cuda_graph", None)
    if cg is not None and cg.any_enabled and not torch.cuda.is_available():
        raise CudaGraphConfigError(
            "model.cuda_graph asks for CUDA graphs but this machine has no CUDA device; run on a GPU machine, or use "
            "`bridge-cudagraph plan` / `validate` here"
        )


# --------------------------------------------------------------------------- before Bridge's own finalization
def check_before_bridge(config: Any) -> None:
    """What Bridge's ``ConfigContainer.validate`` (Bridge 0.6.2 ``training/config.py``) would refuse with a line that
    names no setting, and what this plugin refuses anyway, checked on the config as the user wrote it, before Bridge's
    ``runtime_config_update`` runs (:func:`bridge_cudagraph.plan.from_config.finalize_config`), so that the first line
    a user reads names the setting and the fix. In Bridge's order, with this plugin's own refusal of context
    parallelism under packed graphs first (Bridge's lines about it would come first, and following them leads to it):

    * ``model.seq_length`` past the positions the model was trained for (accepted by Bridge; nothing in the stack
      limits rotary positions, so such a run trains on positions no weight has seen);
    * context parallelism and MoE layers outside their packed scope with packed language graphs
      (:func:`check_packed_context_parallel`, :func:`check_packed_layers`), and fine-grained activation offloading
      with any language graphs (:func:`check_activation_offloading`): the host's own lines about them would come
      first;
    * under context parallelism on a fine-tuning dataset: ``model.seq_length`` a multiple of 2 x cp,
      ``model.calculate_per_token_loss=true`` and ``ddp.average_in_collective=false`` (Bridge asserts them with
      ``When finetuning with CP>1, ... must be ...``);
    * ``dataset.seq_length`` equal to ``model.seq_length`` (Bridge: ``Please ensure sequence length configuration in
      model config and dataset config match``).
    """
    check_positions(config.model)
    cg = getattr(config.model, "cuda_graph", None)
    if cg is not None and cg.language.enabled:
        packing = packing_facts(config)
        if packing is not None:
            model = config.model
            check_packed_context_parallel(int(getattr(model, "context_parallel_size", 1) or 1), packing)
            check_packed_layers(
                num_moe_experts=getattr(model, "num_moe_experts", None), packing=packing, modules=cg.language.modules
            )
        check_activation_offloading(config.model)
    _check_finetuning_context_parallel(config)
    _check_sequence_lengths(config)


def max_positions(model: Any) -> int | None:
    """The positions a provider's model was trained for, where the provider says: ``max_position_embeddings`` of the
    Hugging Face text config Bridge keeps on it (Qwen3-VL's ``hf_text_config``: 262144); None where it keeps none
    (Bridge maps a GPT checkpoint's ``max_position_embeddings`` onto ``seq_length``, which the recipe then sets)."""
    value = getattr(getattr(model, "hf_text_config", None), "max_position_embeddings", None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def check_positions(model: Any) -> None:
    """Refuse a ``model.seq_length`` past :func:`max_positions`."""
    limit = max_positions(model)
    if limit is not None and model.seq_length > limit:
        raise CudaGraphConfigError(
            f"model.seq_length={model.seq_length} is past the {limit} positions {type(model).__name__} was trained "
            "for (max_position_embeddings of its Hugging Face text config; rotary positions past it were never "
            f"trained); set model.seq_length and dataset.seq_length to {limit} or less",
            fix=(f"model.seq_length={limit}", f"dataset.seq_length={limit}"),
        )


def _bridge_datasets(*names: str) -> tuple[type[Any], ...]:
    """Bridge's dataset config classes of these names, as ``training/config.py`` imports them."""
    from megatron.bridge.training import config as bridge_config

    return tuple(
        getattr(bridge_config, name) for name in names if isinstance(getattr(bridge_config, name, None), type)
    )


#: Bridge 0.6.2's providers whose ``finalize()`` turns ``calculate_per_token_loss`` on under context parallelism
#: (``models/qwen_vl/qwen3_vl_provider.py``, ``qwen35_vl_provider.py``), before ``ConfigContainer.validate`` asks.
_PER_TOKEN_LOSS_UNDER_CP = frozenset(
    {"Qwen3VLModelProvider", "Qwen3VLMoEModelProvider", "Qwen35VLModelProvider", "Qwen35VLMoEModelProvider"}
)


def _sets_per_token_loss_itself(model: Any) -> bool:
    return any(cls.__name__ in _PER_TOKEN_LOSS_UNDER_CP for cls in type(model).__mro__)


def _check_finetuning_context_parallel(config: Any) -> None:
    """Bridge's checks of context parallelism on a fine-tuning dataset (``ConfigContainer.validate``: a rank whose
    tokens are all masked would otherwise average to a NaN loss), with the settings named."""
    model, dataset, ddp = config.model, getattr(config, "dataset", None), getattr(config, "ddp", None)
    cp = int(getattr(model, "context_parallel_size", 1) or 1)
    if cp <= 1:
        return
    if model.seq_length % (2 * cp):
        raise CudaGraphConfigError(
            f"model.seq_length={model.seq_length} with model.context_parallel_size={cp}: context parallelism splits "
            f"each sequence into 2 x cp = {2 * cp} chunks; use a multiple of {2 * cp} (e.g. "
            f"{-(-model.seq_length // (2 * cp)) * 2 * cp}), for dataset.seq_length too",
            fix=(
                f"model.seq_length={-(-model.seq_length // (2 * cp)) * 2 * cp}",
                f"dataset.seq_length={-(-model.seq_length // (2 * cp)) * 2 * cp}",
            ),
        )
    finetuning = _bridge_datasets(
        "GPTSFTDatasetConfig", "DirectHFSFTDatasetConfig", "EnergonDatasetConfig", "MockVLMSFTDatasetConfig"
    )
    if not isinstance(dataset, finetuning):
        return

    def refusal(setting: str) -> CudaGraphConfigError:
        return CudaGraphConfigError(
            f"model.context_parallel_size={cp} on a fine-tuning dataset ({type(dataset).__name__}) needs {setting}: "
            "a context-parallel rank whose tokens are all masked would otherwise average to a NaN loss (Bridge's "
            f"rule); set {setting}",
            fix=(setting,),
        )

    if not getattr(model, "calculate_per_token_loss", False) and not _sets_per_token_loss_itself(model):
        raise refusal("model.calculate_per_token_loss=true")
    # Bridge turns average_in_collective off itself under Megatron-FSDP with NCCL symmetric registration
    # (ConfigContainer._validate_and_apply_megatron_fsdp_configs, before this check).
    fsdp = getattr(getattr(config, "dist", None), "use_megatron_fsdp", False) or getattr(
        ddp, "use_megatron_fsdp", False
    )
    switched_off = fsdp and not getattr(ddp, "disable_symmetric_registration", False)
    if getattr(ddp, "average_in_collective", False) and not switched_off:
        raise refusal("ddp.average_in_collective=false")


def _check_sequence_lengths(config: Any) -> None:
    """Bridge's check that the dataset's sequence length is the model's, on its own dataset configs."""
    dataset = getattr(config, "dataset", None)
    canonical = _bridge_datasets(
        "GPTDatasetConfig",
        "GPTSFTDatasetConfig",
        "DirectHFSFTDatasetConfig",
        "EnergonDatasetConfig",
        "MockVLMSFTDatasetConfig",
    )
    if not isinstance(dataset, canonical):
        return
    data, model = dataset.seq_length, config.model.seq_length
    if data != model:
        raise CudaGraphConfigError(
            f"dataset.seq_length {data} != model.seq_length {model}: Bridge builds samples of dataset.seq_length "
            f"tokens for a model of model.seq_length; set both to one value (e.g. dataset.seq_length={model})",
            fix=(f"dataset.seq_length={model}",),
        )


def unpack_fix(packing: PackingFacts) -> str:
    """The fix that names how to stop packing, for the refusals of packed language graphs on this data path."""
    return (
        "set model.cuda_graph.language.enabled=false, or pack no more (dataset.enable_offline_packing=false, "
        "pad_to_max_length=true)"
        if packing.mode == "offline"
        else "pad instead (dataset.enable_in_batch_packing=false, pad_to_max_length=true)"
    )


def check_packed_context_parallel(cp: int, packing: PackingFacts) -> None:
    """Packed language graphs replay one THD sequence per rank, and context parallelism splits each packed row over
    ranks: refused. The one copy, for :func:`build_plan` and for the check before Bridge's finalization
    (:func:`bridge_cudagraph.plan.checks.check_before_bridge`), whose own lines about context parallelism would
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
        f"{unpack_fix(packing)}",
        fix=("model.context_parallel_size=1",),
    )


def check_padded(cfg: CudaGraphConfig, facts: ModelFacts) -> None:
    """The packed-only settings of the language block on a run whose micro-batches are all padded to ``seq_length``
    (one static shape): refused, not silently ignored."""
    given = [
        f"{name}={str(value).lower() if isinstance(value, bool) else repr(value)}"
        for name, value in (
            ("token_budgets", cfg.language.token_budgets),
            ("max_sequences", cfg.language.max_sequences),
            ("tight_packing", cfg.language.tight_packing or None),  # false: off, as on every padded run
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
        f"shape, one graph per layer run); set {'them' if len(given) > 1 else 'it'} to null, or pack: {pack}",
        fix=tuple(f"model.cuda_graph.language.{g.split('=')[0]}=null" for g in given),
    )


def check_model(facts: ModelFacts, cfg: CudaGraphConfig) -> None:
    """The checks of the block against the model that need no world size: the one copy of each, called by
    :func:`build_plan` and by the provider's ``finalize()`` (which must refuse them before a model is built).

    Raises:
        CudaGraphConfigError: Vision graphs or the vision fusion on a model without an encoder, a virtual
            pipeline with Qwen3-VL, language graphs over linear-attention layers (:func:`check_linear_attention`)
            or over what the language ladder does not capture (:func:`check_language_ladder`).
        LayoutError: The vision tensor-parallel size does not divide the encoder's heads
            (:func:`~bridge_cudagraph.parallel.layout.check_vision_heads`, also reached by the group derivation).
    """
    v = facts.vision
    if cfg.vision.enabled and v is None:
        raise CudaGraphConfigError(
            f"model.cuda_graph.vision.enabled=true but {facts.provider} has no vision encoder; set it to false "
            "(vision graphs apply to Qwen3-VL providers)",
            fix=("model.cuda_graph.vision.enabled=false",),
        )
    if v is not None and (facts.virtual_pipeline_size or 1) > 1:
        raise CudaGraphConfigError(
            f"model.virtual_pipeline_model_parallel_size={facts.virtual_pipeline_size} with Qwen3-VL: its provider "
            "ignores vp_stage, so a virtual pipeline builds wrong chunks; set it to null",
            fix=("model.virtual_pipeline_model_parallel_size=null",),
        )
    asked = [part for part in FORWARD_PARTS if getattr(cfg.forward, part)]
    if asked and v is None:
        where = f"model.cuda_graph.forward.{asked[0]}"
        raise CudaGraphConfigError(
            f"{where}=true but {facts.provider} is not Qwen3-VL: it changes Qwen3-VL's forward; leave it null",
            fix=(f"{where}=null",),
        )
    check_linear_attention(facts, cfg)
    check_language_ladder(facts, cfg)
    if v is not None:
        check_vision_heads(cfg.vision.tensor_parallel_size, v.num_heads)
    if v is not None and cfg.vision.enabled and cfg.vision.token_budgets is not None:
        check_token_budgets(list(cfg.vision.token_budgets), v.spatial_merge_size, "model.cuda_graph.vision")


def check_language_ladder(facts: ModelFacts, cfg: CudaGraphConfig) -> None:
    """What the language ladder, the one language capture engine of packed and padded micro-batches
    (:mod:`bridge_cudagraph.capture.language_ladder`), does not capture, refused with the setting and the fix:

    * a ``language.modules`` scope other than whole layers: the ladder's graph of a layer is the whole layer, or on an
      MoE model the layer's attention (:data:`MOE_ATTENTION_SCOPE`, what ``modules: null`` means there), its MLP half
      eager after it;
    * a virtual pipeline: the ladder captures the decoder of one model chunk per rank;
    * a per-layer quantization context (``model.fp8``, ``model.fp4``): the decoder enters it around each layer, and
      the ladder's capture passes TE no quantization recipe, so a replay would not compute what the eager layer does;
    * CPU or fine-grained activation offloading (:func:`check_activation_offloading`'s line, which the CLI gives
      before Bridge's own checks)."""
    where = "model.cuda_graph.language"
    if not cfg.language.enabled:
        return
    modules = cfg.language.modules
    if modules is not None and not (facts.num_moe_experts and set(modules) == set(MOE_ATTENTION_SCOPE)):
        scope = (
            "whole dense layers and of each MoE layer its attention alone (the router and the experts run eagerly "
            "after the graph)"
            if facts.num_moe_experts
            else "whole layers"
        )
        raise CudaGraphConfigError(
            f"{where}.modules={list(modules)} captures parts of {facts.provider}'s layers; the language graphs "
            f"capture {scope}: set {where}.modules=null",
            fix=(f"{where}.modules=null",),
        )
    vp = facts.virtual_pipeline_size or 1
    if vp > 1:
        raise CudaGraphConfigError(
            f"model.virtual_pipeline_model_parallel_size={vp} with {where}.enabled=true: the language graphs capture "
            f"the decoder of one model chunk per rank; set model.virtual_pipeline_model_parallel_size=null, or "
            f"{where}.enabled=false",
            fix=("model.virtual_pipeline_model_parallel_size=null",),
        )
    quantized = [name for name in ("fp8", "fp4") if name in facts.per_layer_contexts]
    if quantized:
        name = quantized[0]
        raise CudaGraphConfigError(
            f"model.{name} is set (by a mixed_precision recipe with {name}, or by hand) with {where}.enabled=true: "
            f"the decoder enters a {name} context around each layer, which the language graphs' capture does not "
            f"reproduce; train in bf16 (mixed_precision=bf16_mixed, model.{name}=null), or set {where}.enabled=false",
            fix=("mixed_precision=bf16_mixed", f"model.{name}=null"),
        )
    offloaded = [name for name in ACTIVATION_OFFLOADING if name in facts.per_layer_contexts]
    if offloaded:
        raise _offloading_refusal(offloaded[0])


def check_linear_attention(facts: ModelFacts, cfg: CudaGraphConfig) -> None:
    """Language graphs over linear-attention layers (megatron-core's ``GatedDeltaNet``, Qwen3.5's
    ``experimental_attention_variant="gated_delta_net"``): refused, packed or padded, since no graph of such a layer
    is proven (megatron-core 0.19.2, flash-linear-attention 0.5.2, read in their source):

    * packed micro-batches: ``_GDNBase._resolve_cu_seqlens`` reads ``cu_seqlens[-1]`` on the host and branches on
      the per-sequence lengths, ``GatedDeltaNet.forward`` compares ``cu_seqlens_q`` with ``cu_seqlens_kv`` on the
      host, and the kernels it calls (``causal_conv1d``, ``chunk_gated_delta_rule``) size their launch grids from
      the values of ``cu_seqlens`` (``prepare_chunk_indices``: one chunk per started 64 tokens of each sequence), so
      a graph would keep the captured micro-batch's grid; their ``tensor_cache`` keys on the tensor's identity, so
      a static ``cu_seqlens`` refilled in place would even be read stale outside a graph;
    * padded micro-batches: nothing reads the host, but the Triton kernels autotune on their first calls and no run
      of a captured layer is recorded against its eager twin.

    The standard attention layers between them are not captured alone: a graph spans a run of whole layers, and
    the run would stop at every linear-attention layer. The vision graphs are unaffected.
    """
    layers = facts.linear_attention_layers
    if not (cfg.language.enabled and layers):
        return
    where = "model.cuda_graph.language"
    raise CudaGraphConfigError(
        f"{where}.enabled=true on {facts.provider}: {len(layers)} of its {facts.num_layers} decoder layers are "
        "gated-delta-net layers (model.experimental_attention_variant='gated_delta_net'), whose packed forward reads "
        "cu_seqlens on the host (megatron-core _GDNBase._resolve_cu_seqlens) and whose kernels size their launch "
        "grids from its values (flash-linear-attention prepare_chunk_indices); no language graph over them is "
        f"proven, packed or padded; set {where}.enabled=false (the vision graphs stay)",
        fix=(f"{where}.enabled=false",),
    )


def check_packed_language(cfg: CudaGraphConfig, facts: ModelFacts, packing: PackingFacts, mbs: int) -> None:
    """What packed language graphs cannot replay, refused with the setting and the fix: a packing path they do not
    know, context parallelism, offline rows more than one per micro-batch, partial layers of a dense model, MoE
    layers other than in their packed scope (:func:`check_packed_layers`), token budgets the data path cannot
    produce or the tensor-parallel split cannot cut, and micro-batches narrower than their budget under sequence
    parallelism."""
    if packing.mode not in ("qwen3_vl_step", "offline"):
        raise CudaGraphConfigError(f"packed language graphs cannot replay the {packing.mode!r} packing path yet")
    offline = packing.mode == "offline"
    check_packed_context_parallel(facts.cp, packing)
    if offline and mbs != 1:
        raise CudaGraphConfigError(
            f"train.micro_batch_size={mbs} with dataset.enable_offline_packing=true: Bridge trains offline-packed "
            "rows one per micro-batch; set train.micro_batch_size=1",
            fix=("train.micro_batch_size=1",),
        )
    check_packed_layers(num_moe_experts=facts.num_moe_experts, packing=packing, modules=cfg.language.modules)
    check_packed_budgets(cfg, facts, packing)
    check_packed_sequence_parallel(cfg, facts, packing)


def check_packed_sequence_parallel(cfg: CudaGraphConfig, facts: ModelFacts, packing: PackingFacts) -> None:
    """Sequence parallelism cuts a packed micro-batch into tp contiguous slices, and a replay pads each rank's slice to
    the budget at its own end: the sequence the attention gathers then interleaves padding between the ranks' tokens,
    while the graphs' static ``cu_seqlens`` and rotary rows hold the real tokens first and the tail after them. So
    under tp > 1 a packed micro-batch replays exactly only at its budget's width: offline-packed rows, and the
    Qwen3-VL step's fixed width (pp > 1 or ep > 1) on the derived budget. Anything narrower would run eagerly
    (:func:`bridge_cudagraph.capture.packed.packed_misfit`, ``split``), so the plan refuses it."""
    if facts.sequence_split == 1 or packing.mode == "offline":
        return
    where = "model.cuda_graph.language"
    if packing.fixed_width and cfg.language.token_budgets is not None:
        raise CudaGraphConfigError(
            f"{where}.token_budgets={list(cfg.language.token_budgets)} with model.sequence_parallel=true at tp "
            f"{facts.tp}: every micro-batch is one fixed width here, and one narrower than its budget cannot replay "
            f"under sequence parallelism (each rank would pad its own slice); set {where}.token_budgets=null (one "
            "budget at that width)",
            fix=(f"{where}.token_budgets=null",),
        )
    if not packing.fixed_width:
        raise CudaGraphConfigError(
            f"model.sequence_parallel=true at tp {facts.tp} with {where}.enabled=true on the Qwen3-VL step's packed "
            "micro-batches: their widths vary, and a replay would pad each rank's slice of the rows at its own end, "
            "interleaving padding between the ranks' tokens where the graphs' static cu_seqlens expect it after "
            f"them; set model.sequence_parallel=false, or {where}.enabled=false (the vision graphs stay)",
            fix=("model.sequence_parallel=false",),
        )


#: What a ladder's language graph of an MoE layer holds (:mod:`bridge_cudagraph.capture.moe_layers`), packed or
#: padded: the attention; the MLP half (router, dispatch, experts, combine) runs eagerly after it on the micro-batch's
#: real rows, so that a packed rung's tail never reaches the router or the experts. ``language.modules: null`` on an
#: MoE model means this scope, which megatron-core's layers read from ``config.cuda_graph_modules``.
MOE_ATTENTION_SCOPE: tuple[str, ...] = ("attn",)


def language_modules(modules: Any, num_moe_experts: int | None) -> tuple[str, ...] | None:
    """``model.cuda_graph.language.modules`` resolved: null on an MoE model is
    :data:`MOE_ATTENTION_SCOPE` (megatron-core's layers read it from ``config.cuda_graph_modules``), else as given
    (None: whole layers)."""
    if modules is None:
        return MOE_ATTENTION_SCOPE if num_moe_experts else None
    return tuple(modules)


#: The provider's activation-offloading switches: their hooks move activations out inside the layers.
ACTIVATION_OFFLOADING: tuple[str, ...] = ("cpu_offloading", "fine_grained_activation_offloading")


def check_activation_offloading(model: Any) -> None:
    """CPU or fine-grained activation offloading under language graphs, packed or padded, read off the config as the
    user wrote it, for :func:`check_before_bridge` (Bridge's own lines about them name no fix); the plan and the
    provider's ``finalize()`` refuse the same with the same line (:func:`check_language_ladder`)."""
    for name in ACTIVATION_OFFLOADING:
        if getattr(model, name, False):
            raise _offloading_refusal(name)


def _offloading_refusal(name: str) -> CudaGraphConfigError:
    where = "model.cuda_graph.language"
    return CudaGraphConfigError(
        f"model.{name}=true with {where}.enabled=true: its offload hooks run inside the layers the language graphs "
        f"capture, and a replay would not run them; set model.{name}=false, or {where}.enabled=false",
        fix=(f"model.{name}=false",),
    )


def check_packed_layers(*, num_moe_experts: int | None, packing: PackingFacts, modules: Any = None) -> None:
    """Layers packed language graphs cannot capture, refused with a fix that validates (the one copy, for
    :func:`check_packed_language` and, before Bridge's finalization, :func:`check_before_bridge`):

    * MoE layers on GPT SFT offline packing: the packed MoE graphs follow Bridge's Qwen3-VL step only;
    * MoE layers in another scope than :data:`MOE_ATTENTION_SCOPE` (which ``modules: null`` derives): a graph that
      holds the router, the dispatch or the experts would run them over the rung's tail, whose rows change the router's
      weight gradient and the experts' blocking (and, for whole MoE layers with a capacity factor, compete for
      capacity), so the MLP half runs eagerly on the real rows.
    """
    where = "model.cuda_graph.language"
    if num_moe_experts and packing.mode == "offline":
        raise CudaGraphConfigError(
            f"{where}.enabled=true with dataset.enable_offline_packing=true on an MoE model ({num_moe_experts} "
            "experts): packed graphs of MoE layers follow Bridge's Qwen3-VL step (in-batch packing), not GPT SFT's "
            f"offline rows; set {where}.enabled=false, or pack no more (dataset.enable_offline_packing=false, "
            "pad_to_max_length=true)",
            fix=(f"{where}.enabled=false",),
        )
    if num_moe_experts and modules is not None and set(modules) != set(MOE_ATTENTION_SCOPE):
        scope = "[" + ",".join(MOE_ATTENTION_SCOPE) + "]"
        raise CudaGraphConfigError(
            f"{where}.modules={list(modules)} with packed micro-batches on an MoE model ({num_moe_experts} experts): "
            f"a graph on a packed rung would run the router and the experts over the rung's padding tail too, "
            f"which changes their numbers; packed MoE layers capture {scope} and run the router, dispatch, experts "
            f"and combine eagerly on the micro-batch's own tokens: set {where}.modules=null",
            fix=(f"{where}.modules=null",),
        )


def check_packed_budgets(cfg: CudaGraphConfig, facts: ModelFacts, packing: PackingFacts) -> None:
    """The block's packed token budgets: offline rows are all ``seq_length`` wide (one budget), and sequence
    parallelism cuts every packed width into tp equal slices."""
    where = "model.cuda_graph.language"
    tp = facts.sequence_split
    if packing.mode == "offline":
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
        return
    bad = [b for b in cfg.language.token_budgets or () if b % tp]
    if bad:
        raise CudaGraphConfigError(
            f"{where}.token_budgets {list(bad)} are not multiples of tp {facts.tp} (sequence parallel splits "
            f"the static hidden states over tp ranks): use multiples of {tp}, e.g. "
            f"{[-(-b // tp) * tp for b in bad]}"
        )


def check_sequence_split(facts: ModelFacts) -> None:
    """The static hidden states of a language graph need equal slices of ``seq_length`` over the context-parallel
    ranks, and over the tensor-parallel ranks too under sequence parallelism."""
    split = facts.seq_length // facts.cp
    if facts.seq_length % facts.cp or split % facts.sequence_split:
        by = facts.cp * facts.sequence_split
        raise CudaGraphConfigError(
            f"model.seq_length {facts.seq_length} is not divisible by cp {facts.cp}"
            + (f" x tp {facts.tp} (sequence parallel)" if by != facts.cp else "")
            + f" = {by} ({facts.seq_length} % {by} = {facts.seq_length % by}); the static hidden states need "
            f"equal slices: use a multiple of {by}"
        )
