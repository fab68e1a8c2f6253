"""Run-level checks: settings outside the model provider that make static-shape graphs impossible or unsafe.

The provider's own ``finalize()`` (:mod:`bridge_cudagraph.mixin`) checks the model; this looks at the rest of a
Bridge ``ConfigContainer`` (data loading, packing, environment) before any process group or GPU work, so a bad
run fails at config time with the setting and the fix, not with a shape error from TE at step N.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from bridge_cudagraph.config import CudaGraphConfigError

if TYPE_CHECKING:
    from bridge_cudagraph.plan import PackingFacts


def check_environment(environ: dict[str, str] | None = None) -> None:
    """``expandable_segments:True`` makes NCCL's graph registration read freed memory unless it is disabled
    (megatron-core asserts this only when the helper is built, i.e. at the capture step)."""
    env = os.environ if environ is None else environ
    if "expandable_segments:True" in env.get("PYTORCH_CUDA_ALLOC_CONF", "") and env.get("NCCL_GRAPH_REGISTER") != "0":
        raise CudaGraphConfigError(
            "PYTORCH_CUDA_ALLOC_CONF has expandable_segments:True, which with CUDA graphs needs NCCL_GRAPH_REGISTER=0 "
            "(else illegal memory accesses); export NCCL_GRAPH_REGISTER=0 or drop expandable_segments"
        )


def check_stack(config: Any) -> None:
    """What this machine's installed stack cannot build, whatever the graphs: checked by ``train`` (after the plan,
    so a configuration error keeps ``validate``'s line) and by the random base builder, before any model exists;
    ``validate`` and ``plan`` may run for another machine and leave it out.

    ``model.gradient_accumulation_fusion=true`` without APEX: Bridge enables it whenever Transformer Engine
    imports, but megatron-core's non-TE output layer then raises deep inside model construction (see
    :func:`bridge_cudagraph.compat.apex_gradient_accumulation_fusion_available`)."""
    from bridge_cudagraph.compat import apex_gradient_accumulation_fusion_available

    if getattr(config.model, "gradient_accumulation_fusion", False) and not (
        apex_gradient_accumulation_fusion_available()
    ):
        raise CudaGraphConfigError(
            "model.gradient_accumulation_fusion=true needs APEX's fused_weight_gradient_mlp_cuda extension "
            "(megatron-core's output layer, a ColumnParallelLinear, refuses to build without it), which this "
            "machine lacks (Bridge turns the fusion on whenever Transformer Engine imports); set "
            "model.gradient_accumulation_fusion=false, or install APEX with its CUDA extensions"
        )


def packing_facts(config: Any) -> PackingFacts | None:
    """How the run's data path packs sequences, or None when every micro-batch is padded to ``seq_length``.

    The one reading of the dataset's packing switches (Bridge 0.6.2 ``training/config.py``, ``qwen3_vl_step``):
    ``enable_in_batch_packing`` with ``defer_in_batch_packing_to_step`` is Bridge's Qwen3-VL fine-tuning default,
    packed by the step; collate-time packing (``vlm_step``, ``gpt_step``) and GPT SFT offline packing are other
    paths. Which of them language graphs can replay is :func:`check_run`'s decision.
    """
    from bridge_cudagraph.plan import PackingFacts

    dataset, model = getattr(config, "dataset", None), config.model
    if getattr(dataset, "enable_offline_packing", False):
        return PackingFacts("offline")
    if not getattr(dataset, "enable_in_batch_packing", False):
        return None
    if not getattr(dataset, "defer_in_batch_packing_to_step", False):
        return PackingFacts("collate")
    fixed = (getattr(model, "pipeline_model_parallel_size", 1) or 1) > 1 or (
        getattr(model, "expert_model_parallel_size", 1) or 1
    ) > 1
    return PackingFacts("qwen3_vl_step", fixed_width=fixed)


def check_run(config: Any) -> PackingFacts | None:
    """Check a Bridge ``ConfigContainer`` whose model carries a ``cuda_graph`` block with graphs on; returns how its
    data path packs (for the plan), None when it pads."""
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
    loader = getattr(dataset, "dataloader_type", None) or getattr(train, "dataloader_type", None)
    if loader == "batch":
        raise CudaGraphConfigError(
            "dataset.dataloader_type='batch' gives every step its own sequence length, but language graphs have "
            "static shapes; use dataloader_type 'single' or 'cyclic'"
        )
    if packing is not None and packing.mode != "qwen3_vl_step":
        what = {
            "offline": "dataset.enable_offline_packing=true (GPT SFT packed sequences)",
            "collate": "dataset.enable_in_batch_packing=true with collate-time packing (defer_in_batch_packing_to_step"
            "=false)",
        }[packing.mode]
        raise CudaGraphConfigError(
            f"{what} is a packing path language graphs cannot replay yet (packed graphs follow Bridge's Qwen3-VL "
            "step: enable_in_batch_packing=true with defer_in_batch_packing_to_step=true); pad instead "
            "(dataset.pad_to_max_length=true, no packing) or set model.cuda_graph.language.enabled=false"
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
            "recipes do (enable_in_batch_packing=true, defer_in_batch_packing_to_step=true) for packed graphs"
        )
    seq = getattr(dataset, "seq_length", None) or getattr(dataset, "sequence_length", None)
    if seq is not None and seq != model.seq_length:
        raise CudaGraphConfigError(
            f"dataset sequence length {seq} != model.seq_length {model.seq_length}: the graphs are captured at "
            "model.seq_length; make them equal"
        )
    return packing


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
            f"set scheduler.weight_decay_incr_style=constant (start_weight_decay = end_weight_decay) {fix}"
        )
    if getattr(optimizer, "fp16", False):
        raise CudaGraphConfigError(
            "optimizer.optimizer_cuda_graph=true cannot capture an fp16 step (the loss scaler reads found_inf on the "
            f"host); train in bf16 (mixed_precision=bf16_mixed) {fix}"
        )
    threshold = getattr(optimizer, "grad_norm_skip_threshold", float("inf"))
    if threshold is not None and threshold != float("inf"):
        raise CudaGraphConfigError(
            f"optimizer.optimizer_cuda_graph=true with optimizer.grad_norm_skip_threshold={threshold}: the skip "
            "test reads the grad norm on the host inside the capture, and every replay reports the capture step's "
            f"outcome; set optimizer.grad_norm_skip_threshold=inf {fix}"
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
