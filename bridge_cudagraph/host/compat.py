"""Every version probe of the host stack, in one place.

Each probe names the megatron-core / Megatron-Bridge / Transformer Engine version whose behaviour it
works around, so a reader upgrading the stack knows what to re-check. Nothing else in the package looks
at versions or signatures.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from importlib import metadata
from typing import Any

#: The stack this plugin is built and tested against (see pyproject.toml).
TESTED_STACK = {"megatron-core": "0.19.2", "megatron-bridge": "0.6.2", "transformer-engine": "2.20.2"}


#: Set to ``1`` to run on releases of :data:`TESTED_STACK`'s packages this package was not proven on.
UNPROVEN_STACK_ENV = "BRIDGE_CUDAGRAPH_UNPROVEN_STACK"


def check_proven_stack(versions: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None) -> None:
    """The one version check, before any model is built (``validate``, ``plan``, ``train``, and a provider's
    ``finalize()`` in a user's own script): the host code this package mirrors or changes
    (:mod:`bridge_cudagraph.host`) was written for :data:`TESTED_STACK`'s releases (major.minor), and another release
    may have moved what it relies on, deep inside capture or a step. So another release is refused in one line, unless
    :data:`UNPROVEN_STACK_ENV` is ``1``; then the mirrored steps still stay the host's by their own gates
    (:func:`optimizer_step_is_mirrored` and the like).

    Args:
        versions: Package name -> version; default: read from the installed modules (a source install counts).
        environ: Default ``os.environ``.

    Raises:
        CudaGraphConfigError: A package's release is not the proven one.
    """
    import importlib
    import os

    from bridge_cudagraph.config import CudaGraphConfigError

    env = os.environ if environ is None else environ
    if env.get(UNPROVEN_STACK_ENV) == "1":
        return
    if versions is None:
        versions = {dist: importlib.import_module(module).__version__ for dist, module in _VERSION_MODULES.items()}
    unproven = [f"{n} {v}" for n, v in versions.items() if not _proven(n, v)]
    if unproven:
        proven = ", ".join(f"{name} {_release(version)}x" for name, version in TESTED_STACK.items())
        raise CudaGraphConfigError(
            f"{' and '.join(unproven)} {'is not a release' if len(unproven) == 1 else 'are not releases'} "
            f"bridge_cudagraph was proven on ({proven}); install those, or set {UNPROVEN_STACK_ENV}=1 to try anyway"
        )


def installed_version(dist: str) -> str | None:
    """The installed version of a distribution, or None (NGC containers may install from source)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def helper_accepts_pg_collection() -> bool:
    """megatron-core >= 0.17 (MLM PR #3137): ``TECudaGraphHelper.__init__`` takes ``pg_collection``.

    Without it the helper reads ``parallel_state`` globals, which this plugin never initialises.
    """
    from megatron.core.transformer.cuda_graphs import TECudaGraphHelper

    return "pg_collection" in inspect.signature(TECudaGraphHelper.__init__).parameters


@functools.cache
def vision_helper_accepts_pg_collection() -> bool:
    """megatron-core 0.19 ``VisionTECudaGraphHelper.__init__`` takes ``pg_collection`` (passed on to
    ``TECudaGraphHelper``, see :func:`helper_accepts_pg_collection`), as Bridge 0.6.2's ``train()`` probes before
    building it (``train.py``); the benchmark builds upstream's helpers the same way."""
    from megatron.core.transformer.cuda_graphs import VisionTECudaGraphHelper

    return "pg_collection" in inspect.signature(VisionTECudaGraphHelper.__init__).parameters


@functools.cache
def te_graphs_clone_param_grads() -> bool:
    """TE 2.20 ``make_graphed_callables`` takes ``clone_param_grads_on_return`` (default True, which every capture
    here keeps): each backward replay clones every parameter gradient it returns, so that no later replay of the
    shared pool can write a gradient its reader has not read yet; the per-callable flags are what the summing graphs
    switch off (:mod:`bridge_cudagraph.host.graph_grads`). Older TE returns the graph's buffers and has no such
    argument."""
    from transformer_engine.pytorch import make_graphed_callables

    return "clone_param_grads_on_return" in inspect.signature(make_graphed_callables).parameters


#: The closure names, from the callable ``make_graphed_callables`` returns down to its ``Graphed.backward``, that
#: :func:`te_graphed_backward_state` follows (Transformer Engine 2.20 ``pytorch/graph.py``): ``new_fwd`` holds
#: ``graphed`` (``functionalized``), which holds ``Graphed`` and ``module_params``; the backward holds the callable's
#: ``static_grad_inputs`` and ``returned_param_grad_clone_slots``.
TE_GRAPHED_CLOSURE = ("graphed", "Graphed", "module_params", "static_grad_inputs", "returned_param_grad_clone_slots")


def _cell(function: Any, name: str) -> Any:
    """The closure cell ``name`` of ``function``, or None."""
    code = getattr(function, "__code__", None)
    if code is None or name not in code.co_freevars or function.__closure__ is None:
        return None
    return function.__closure__[code.co_freevars.index(name)]


def te_graphed_backward_state(graphed: Any) -> tuple[tuple, Any, Any] | None:
    """For one callable TE 2.20's ``make_graphed_callables`` returned (a module whose ``forward`` it replaced, or
    the replacement itself under ``_order``): ``(module_params, static_grad_inputs cell, clone slots cell)`` of its
    ``Graphed`` autograd function, or None where the installed TE is not the proven release or does not hold them
    where :data:`TE_GRAPHED_CLOSURE` says. ``static_grad_inputs`` ends with one gradient buffer per entry of
    ``module_params`` (None where it needs none); the clone slots say which of them each backward replay clones.

    TE exposes neither, and :mod:`bridge_cudagraph.capture.param_grads` needs both: no public path would reach them
    without patching TE's module."""
    import torch

    if not _proven("transformer-engine"):
        return None
    forward = graphed.forward if isinstance(graphed, torch.nn.Module) else graphed
    names = TE_GRAPHED_CLOSURE
    functionalized = _cell(forward, names[0])
    functionalized = None if functionalized is None else functionalized.cell_contents
    graphed_cls = _cell(functionalized, names[1])
    params = _cell(functionalized, names[2])
    if graphed_cls is None or params is None:
        return None
    backward_fn: Any = getattr(graphed_cls.cell_contents, "backward", None)  # unwrap(None) is None
    backward = inspect.unwrap(backward_fn)
    grads, slots = _cell(backward, names[3]), _cell(backward, names[4])
    if grads is None or slots is None:
        return None
    module_params, static_grads, clone_slots = params.cell_contents, grads.cell_contents, slots.cell_contents
    if not (
        isinstance(module_params, tuple)
        and isinstance(static_grads, tuple)
        and isinstance(clone_slots, tuple)
        and len(static_grads) == len(clone_slots) >= len(module_params)
    ):
        return None
    return module_params, grads, slots


@functools.cache
def te_graphs_share_ladder_buffers() -> bool:
    """TE 2.20 ``make_graphed_callables`` takes ``_order`` with ``_reuse_graph_input_output_buffers`` (written for
    megatron-core's pipeline schedules): after each backward is captured, the forward's static outputs and the
    consumed gradient buffers are held by weak reference only, so their memory goes back to the capture pool and the
    next capture into that pool reuses it. A budget ladder captures one rung at a time into one pool
    (:func:`bridge_cudagraph.capture.ladder_capture.capture_budget_ladder`); without this, every rung keeps its own
    outputs and, for weights whose gradient TE does not fuse, a full set of parameter gradients."""
    from transformer_engine.pytorch import make_graphed_callables

    names = inspect.signature(make_graphed_callables).parameters
    return all(n in names for n in ("_order", "_num_layers_per_chunk", "_reuse_graph_input_output_buffers")) and (
        te_graphs_clone_param_grads()
    )


def bridge_train_module():
    """Bridge's training-loop module (``megatron.bridge.training.train``), where it builds its helpers."""
    from megatron.bridge.training import train

    return train


@functools.cache
def bridge_builds_language_helper_by_name() -> bool:
    """Megatron-Bridge 0.6.2 ``train()`` builds its language graph helper by calling the module-level name
    ``TECudaGraphHelper`` of ``megatron.bridge.training.train`` at call time (``train.py``), so rebinding
    that name reaches it (:func:`bridge_cudagraph.bridge.loop.install_bridge_helper`). A Bridge that builds it any
    other way would capture a second time behind the plugin's back; ``install_bridge_helper`` refuses then."""
    source = inspect.getsource(bridge_train_module().train)
    return "TECudaGraphHelper(" in source


#: The fields of megatron-core 0.19.2's ``ProcessGroupCollection`` that name a GTP_remat group, each with the field
#: whose very group it is while GTP_remat is off (``gtp_weight_remat_size`` and ``expert_gtp_weight_remat_size`` 1):
#: ``parallel_state`` aliases them then (``parallel_state.py``; the expert ``tp-ep-gtp_remat-pp``
#: groups reduce to ``tp-ep-pp``). Megatron-Bridge 0.6.2's ``_create_pg_collection``
#: (``training/initialize.py``), which builds the collection of ``dist.use_decentralized_pg=true``, sets none.
GTP_REMAT_ALIASES = {
    "dp_cp_gtp_remat": "dp_cp",
    "expt_dp_gtp_remat": "expt_dp",
    "tp_ep_pp_with_egtp_remat": "tp_ep_pp",
}


@functools.cache
def collection_declares_gtp_remat_groups() -> bool:
    """megatron-core 0.19.2 declares every field of :data:`GTP_REMAT_ALIASES` on ``ProcessGroupCollection`` (an unset
    one reads as ``None``, its ``__getattr__``) and reads them where the host falls back to ``parallel_state`` on
    ``None``: ``MoEMetricsTracker._sync_metrics`` (``moe_logging.py``, called by Bridge's ``training_log``
    for every MoE model) asks for ``dp_cp_gtp_remat`` and, without it, for
    ``parallel_state.get_data_parallel_group``, which asserts under pure M4. A core without these fields reads none
    of them: :func:`bridge_cudagraph.host.gtp_remat_aliases.complete_bridge_collection` then changes nothing."""
    import dataclasses

    from megatron.core.process_groups_config import ProcessGroupCollection

    declared = {f.name for f in dataclasses.fields(ProcessGroupCollection)}
    return all(name in declared and target in declared for name, target in GTP_REMAT_ALIASES.items())


def init_signature(cls: type[Any]) -> inspect.Signature:
    """The signature of ``cls.__init__``, as Bridge's ``"pg_collection" in inspect.signature(...)`` probe sees it
    (megatron-core >= 0.17 adds ``pg_collection``, see :func:`helper_accepts_pg_collection`)."""
    return inspect.signature(cls.__init__)


def dataset_helpers_prebuilt_without_makefile() -> bool:
    """megatron-core's PyPI wheels (0.19.2 seen) ship the compiled ``megatron.core.datasets.helpers_cpp`` but not the
    Makefile that Bridge 0.6.2's ``initialize_megatron`` runs ``make -C`` on (``bridge/training/initialize.py``
    ``compile_helpers()``). True when the Makefile is absent and the prebuilt module imports: then
    :func:`bridge_cudagraph.host.dataset_helpers.use_prebuilt_dataset_helpers` applies. A source install (NGC) has the
    Makefile."""
    import importlib
    import os

    from megatron.core.datasets import utils as dataset_utils

    folder = os.path.dirname(dataset_utils.__file__)
    if os.path.exists(os.path.join(folder, "Makefile")):
        return False
    try:
        importlib.import_module("megatron.core.datasets.helpers_cpp")
    except ImportError:
        return False
    return True


def apex_gradient_accumulation_fusion_available() -> bool:
    """Whether APEX's ``fused_weight_gradient_mlp_cuda`` extension is importable: megatron-core's own
    ``ColumnParallelLinear`` / ``RowParallelLinear`` (the language model's output layer, whatever the transformer
    layers use) raise at construction with ``gradient_accumulation_fusion=True`` without it (0.19.2
    ``tensor_parallel/layers.py``). Bridge 0.6.2 turns the fusion on whenever Transformer Engine imports
    (``utils/fusions.py``, ``can_enable_gradient_accumulation_fusion``), so a stack with TE and no APEX (the PyPI
    wheels) builds no model from such a recipe."""
    import importlib.util

    return importlib.util.find_spec("fused_weight_gradient_mlp_cuda") is not None


def linear_attention_kernels_available() -> bool:
    """Whether flash-linear-attention (the ``fla`` package) is importable: megatron-core 0.19.2's
    ``GatedDeltaNet`` (``ssm/gated_delta_net``, the linear attention of Qwen3.5's
    ``experimental_attention_variant="gated_delta_net"``) takes its ``causal_conv1d`` and ``chunk_gated_delta_rule``
    from it and raises ``ImportError`` at construction without it (``_GDNBase.__init__``); neither megatron-core
    nor Bridge declares it as a dependency."""
    import importlib.util

    return importlib.util.find_spec("fla") is not None


#: flash-linear-attention 0.5.2 raises in the backward of a gated chunk (``fla.ops.common.chunk_o.chunk_bwd_dqkwg``)
#: on Hopper with a Triton from this range, whose kernels give wrong gradients there (FLA's issue 640), unless its
#: TileLang backend takes that kernel (installed ``tilelang``, not switched off by ``FLA_TILELANG=0``).
FLA_BROKEN_TRITON_ON_HOPPER = ("3.4.0", "3.7.1")


def linear_attention_backward_refusal(
    capability: tuple[int, int] | None,
    triton_version: str | None,
    tilelang_installed: bool,
    environ: Mapping[str, str],
) -> str | None:
    """Why flash-linear-attention will refuse the gated-delta-net backward on this machine (FLA raises a
    ``RuntimeError`` at the first backward, deep in the step), or None. ``capability``: the GPU's compute capability
    (None without one); Hopper is major 9, as FLA's ``IS_NVIDIA_HOPPER`` reads it."""
    if capability is None or capability[0] != 9 or triton_version is None:
        return None
    low, high = FLA_BROKEN_TRITON_ON_HOPPER
    if not _release_tuple(low) <= _release_tuple(triton_version) < _release_tuple(high):
        return None
    if tilelang_installed and environ.get("FLA_TILELANG", "1") != "0":
        return None
    return (
        f"Triton {triton_version} on a Hopper GPU: flash-linear-attention refuses its gated-delta backward with "
        f"Triton >= {low} and < {high} there (wrong gradients, its issue 640)"
    )


def _release_tuple(version: str) -> tuple[int, ...]:
    """The leading numeric release of a version string (``3.6.0+git1a2b`` -> ``(3, 6, 0)``)."""
    import re

    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def machine_linear_attention_backward_refusal() -> str | None:
    """:func:`linear_attention_backward_refusal` of this process's GPU, Triton and packages."""
    import importlib.util
    import os

    import torch

    if not torch.cuda.is_available():
        return None
    try:
        import triton
    except ImportError:
        return None
    capability = torch.cuda.get_device_capability()
    tilelang = importlib.util.find_spec("tilelang") is not None
    return linear_attention_backward_refusal(capability, triton.__version__, tilelang, os.environ)


def _release(version: str) -> str:
    """``major.minor.`` of a version string (``0.19.2`` -> ``0.19.``)."""
    return ".".join(version.split(".")[:2]) + "."


#: The module whose ``__version__`` gives each package's installed release (a source install in an NGC container
#: counts too, where the distribution's metadata may be missing).
_VERSION_MODULES = {
    "megatron-core": "megatron.core",
    "megatron-bridge": "megatron.bridge",
    "transformer-engine": "transformer_engine",
}


def _proven(dist: str, version: str | None = None) -> bool:
    """Whether ``version`` (default: the installed one, read from the package's module) is :data:`TESTED_STACK`'s
    release (major.minor) of ``dist``: the one predicate of the stack check and of each mirrored step's gate."""
    if version is None:
        import importlib

        version = importlib.import_module(_VERSION_MODULES[dist]).__version__
    return str(version).startswith(_release(TESTED_STACK[dist]))


#: The megatron-core and Transformer Engine releases whose optimizer steps :mod:`bridge_cudagraph.host.optimizer`
#: mirrors (``DistributedOptimizer``'s per-parameter walks, ``FusedAdam.step``'s plain fp32 path), by prefix: the
#: releases of :data:`TESTED_STACK`.
OPTIMIZER_STEP_MIRRORS = (_release(TESTED_STACK["megatron-core"]), _release(TESTED_STACK["transformer-engine"]))


@functools.cache
def optimizer_step_is_mirrored() -> bool:
    """Whether the installed megatron-core and Transformer Engine are the releases of :data:`OPTIMIZER_STEP_MIRRORS`
    (read from their modules, so a source install counts too). Another release may have changed what those steps
    do per parameter, so the cache stays off there rather than risk a different step."""
    return all(_proven(dist) for dist in ("megatron-core", "transformer-engine"))


@functools.cache
def finalize_walk_is_mirrored() -> bool:
    """Whether the installed megatron-core is :data:`TESTED_STACK`'s release, whose ``reset_model_temporary_tensors``
    (finalize_model_grads.py) :mod:`bridge_cudagraph.host.finalize` lists the modules of (its three attribute
    tests); another release may test others, so the walk stays the host's there."""
    return _proven("megatron-core")


#: The Megatron-Bridge release whose Qwen3-VL forward :mod:`bridge_cudagraph.host.forward` mirrors, by prefix: when
#: ``Qwen3VLModel.forward`` calls ``get_rope_index`` and with which arguments, and ``_deepstack_process``.
QWEN3_VL_FORWARD_MIRRORS = _release(TESTED_STACK["megatron-bridge"])


@functools.cache
def qwen3_vl_forward_is_mirrored() -> bool:
    """Whether the installed Megatron-Bridge is the release of :data:`QWEN3_VL_FORWARD_MIRRORS` (read from its
    module, so a source install counts too). Another release may derive the positions elsewhere or with other
    arguments, so the forward stays the host's there."""
    return _proven("megatron-bridge")


# ----------------------------------------------------------------------------------- named accessors of host internals
# The host's private names this package reads, each behind one accessor: the only place outside the rest of host/ that
# names them (tests/unit/test_package.py holds every other module to that), with the release it was written for.


def set_graph_capturing(capturing: bool) -> None:
    """megatron-core 0.19's process-wide "capturing" flag (``cuda_graphs._set_capture_start`` / ``_set_capture_end``),
    which its DDP hooks and layers read, for captures megatron-core does not run itself."""
    from megatron.core.transformer import cuda_graphs

    (cuda_graphs._set_capture_start if capturing else cuda_graphs._set_capture_end)()


def deepstack_process(block: Any, hidden_states: Any, visual_pos_masks: Any, embeds: Any) -> Any:
    """Bridge 0.6.2's ``Qwen3VLTransformerBlock._deepstack_process``: one deepstack feature added at the visual rows,
    as the block's own loop adds it between layers."""
    return block._deepstack_process(hidden_states, visual_pos_masks, embeds)


def layer_attention(layer: Any, hidden_states: Any, rotary_pos_emb: Any, packed_seq_params: Any) -> Any:
    """megatron-core 0.19's ``TransformerLayer._forward_attention`` with no attention mask, on packed rows (the
    boundaries are in ``packed_seq_params``) or padded ones (``packed_seq_params`` None: causal rows): the hidden
    states after the attention's residual add, the first half of ``TransformerLayer.forward``."""
    hidden_states, _ = layer._forward_attention(
        hidden_states=hidden_states,
        attention_mask=None,
        rotary_pos_emb=rotary_pos_emb,
        packed_seq_params=packed_seq_params,
    )
    return hidden_states


def layer_mlp(layer: Any, hidden_states: Any) -> Any:
    """megatron-core 0.19's ``TransformerLayer._forward_mlp``, the second half of ``TransformerLayer.forward``: the
    pre-MLP norm, the MLP (an MoE layer's router, dispatch, experts and combine) and the residual add. No padding
    mask and no ``packed_seq_params``, as Bridge 0.6.2's packed step runs it (it sets neither a padding mask nor
    ``tokens_per_sample``)."""
    return layer._forward_mlp(hidden_states)


def param_gather_hook_maker(chunk: Any) -> Any:
    """megatron-core 0.19 DDP's ``_make_forward_pre_hook``: what ``setup_manual_hooks`` needs to make a layer's
    parameter all-gather hooks (``overlap_param_gather``), which replay bypasses."""
    return chunk._make_forward_pre_hook


def provider_pg_collection(provider: Any) -> Any:
    """The collection Bridge 0.6.2's ``provide_distributed_model(pg_collection=...)`` stores on the provider
    (``_pg_collection``), or None before it ran."""
    return getattr(provider, "_pg_collection", None)


def config_pg_collection(config: Any) -> Any:
    """megatron-core 0.19's ``TransformerConfig._pg_collection`` (groups a module built from the config reads
    instead of ``parallel_state``), or None."""
    return getattr(config, "_pg_collection", None)


def set_config_pg_collection(config: Any, pg_collection: Any) -> None:
    """Give a ``TransformerConfig`` the collection its modules read (:func:`config_pg_collection`)."""
    config._pg_collection = pg_collection


def in_batch_packing_marked(model_config: Any) -> bool:
    """Whether Bridge 0.6.2's ``ConfigContainer.validate`` marked in-batch packing on the model config
    (``_enable_in_batch_packing``)."""
    return bool(getattr(model_config, "_enable_in_batch_packing", False))


def ensure_global_memory_buffer() -> None:
    """megatron-core 0.19's ``parallel_state`` global memory buffer, which some kernels take their scratch from even
    under explicit collections: made once where nothing made it."""
    from megatron.core import parallel_state

    if getattr(parallel_state, "_GLOBAL_MEMORY_BUFFER", None) is None:
        parallel_state._set_global_memory_buffer()


def qwen3_vl_pad_and_pack() -> Any:
    """Bridge 0.6.2's ``qwen3_vl_step._pad_and_pack_qwen3_vl_step``: the step's own padding and packing of a collated
    batch, which the test batches go through as Bridge's step does."""
    from megatron.bridge.models.qwen_vl.qwen3_vl_step import _pad_and_pack_qwen3_vl_step

    return _pad_and_pack_qwen3_vl_step


def dataset_processor(dataset: Any) -> Any:
    """The Hugging Face processor of Bridge 0.6.2's VLM SFT dataset (``_processor``)."""
    return dataset._processor


def peft_transformation() -> Any:
    """Bridge 0.6.2's ``training/setup.py`` ``_apply_peft_transformation(peft, model)``: PEFT as a pre-wrap hook."""
    from megatron.bridge.training.setup import _apply_peft_transformation

    return _apply_peft_transformation


def register_pre_wrap_hook() -> Any:
    """Bridge 0.6.2's ``training/setup.py`` ``_register_pre_wrap_hook(provider, hook)``: a hook after the provider's
    own, as its setup registers PEFT."""
    from megatron.bridge.training.setup import _register_pre_wrap_hook

    return _register_pre_wrap_hook
