"""The optimizer step's per-parameter host work, done once instead of on every step.

Host change:
  changes: the class of one ``ChainedOptimizer``, its ``DistributedOptimizer`` members and their TE ``FusedAdam``
    objects (a mixin in front, :func:`~bridge_cudagraph.host.instance_class.extend_instance_class`); mirrors their
    steps' per-parameter walks
  written for: megatron-core 0.19.2, Transformer Engine 2.20
  gate: the proven stack (:func:`~bridge_cudagraph.host.compat.check_proven_stack`);
    :func:`~bridge_cudagraph.host.compat.optimizer_step_is_mirrored`; ``model.cuda_graph.cached_walks.optimizer``
  undo: :func:`uninstall`

Why: a graphed step is host-bound (on the 2B shape the GPU runs 119 ms of kernels in a 177 ms step), and
the optimizer step is the longest stretch without a kernel. megatron-core 0.19.2's ``DistributedOptimizer.step`` and
Transformer Engine 2.20's ``FusedAdam.step`` walk every parameter in Python on every step: the main-gradient views
(``_copy_model_grads_to_main_grads``), the gradients of the norm (``get_grads_for_grad_norm``) and of the clip
(``clip_grad_by_total_norm_fp32``), Adam's tensor lists (``FusedAdam.step``), one ``copy_`` launch per parameter back
into the bf16 buffer (``_copy_main_params_to_model_params``) and the ``.grad`` resets of ``zero_grad``, 541 parameters
each for Qwen3-VL-2B. Bridge's optimizer graph removes that
work too (the step went from 176.9 to 154.8 ms), but it needs the capturable Adam kernel, 1.5x slower at 2.1B
parameters and 1-2 ulps off the default one.

What those walks compute is the same on every step: views into the DDP buffers, a list of the same gradient tensors,
the same tensor lists. The three mixins here (the distributed optimizer's, FusedAdam's, and the ``ChainedOptimizer``'s
that ``get_megatron_optimizer`` always wraps them in, whose own ``step`` does the clip) compute it once (and again
only when a DDP buffer is replaced) and launch the same kernels on the same tensors with the same arguments, so a
step is bitwise the host's
(``tests/gpu/test_optimizer_host_step.py``): only the Python around the kernels goes, and the 541 parameter copies
become one ``torch._foreach_copy_``. Each overridden method falls back to the host's own where a precondition does
not hold (precision-aware optimizer, Megatron-FSDP, quantized parameters, bf16 main gradients, a separate grad-norm
group, capturable or master-weight Adam, DTensor or non-fp32 state), so a configuration this module was not written
for steps exactly as before.

:func:`install` puts the mixins in front of the optimizer objects' classes (one object each, through
:func:`bridge_cudagraph.host.instance_class.extend_instance_class`); :func:`uninstall` takes them off and drops the
cache.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from bridge_cudagraph.host import compat
from bridge_cudagraph.host.instance_class import (
    HostABCMixin,
    HostMixin,
    extend_instance_class,
    restore_instance_class,
)

__all__ = [
    "CachedAdamLists",
    "CachedChainedStep",
    "CachedShardViews",
    "cached_steps",
    "install",
    "installed",
    "uninstall",
]

logger = logging.getLogger("bridge_cudagraph")

#: Instance attribute holding a mixin's cache (dropped by :func:`uninstall`; no host code reads or saves it).
CACHE = "_bridge_cudagraph_host_cache"


# ----------------------------------------------------------------------------------- the distributed optimizer
@dataclass
class _ShardViews:
    """What megatron-core's per-parameter walks of the distributed optimizer recompute every step.

    Attributes:
        key: Identity of the DDP buffers the views were taken from (rebuilt when one is replaced).
        grads: ``(shard main param, its slice of the model param's main_grad)``, the assignments of
            ``_copy_model_grads_to_main_grads``; None where that method must run as the host's.
        copy_to / copy_from: The bf16 buffer slices and the fp32 main shards ``_copy_main_params_to_model_params``
            copies between, in its order; None where that method must run as the host's.
        grads_assigned: This step's main gradients are :attr:`grads`' views (set by the cached assignment, cleared by
            ``zero_grad``): only then is a cached norm list the host's list.
        norm_lists: ``grad_norm_group -> the host's get_grads_for_grad_norm list``, taken on a step with
            :attr:`grads_assigned`.
        cached_steps: Steps whose gradient assignment and parameter copy took the cached path.
        clip_grads: The main gradients ``clip_grad_by_total_norm_fp32`` scales (its ``param.grad.detach()`` of every
            main param), taken on a step with :attr:`grads_assigned`; None until then.
        separate_norm_groups: Some parameter is in a separate grad-norm group (megatron-core's MTP): the clip is the
            host's.
        has_params: ``get_parameters()`` is not empty (a chained step skips the clip of an empty optimizer).
        grad_params: Every parameter whose ``.grad`` the host's ``zero_grad(set_to_none=True)`` clears.
    """

    key: tuple
    grads: list[tuple[torch.Tensor, torch.Tensor]] | None
    copy_to: list[torch.Tensor] | None
    copy_from: list[torch.Tensor] | None
    grads_assigned: bool = False
    norm_lists: dict[Any, list[torch.Tensor]] = field(default_factory=dict)
    cached_steps: int = 0
    clip_grads: list[torch.Tensor] | None = None
    separate_norm_groups: bool = False
    has_params: bool = True
    grad_params: list[torch.Tensor] = field(default_factory=list)


def _buffers_key(optimizer: Any) -> tuple:
    """The DDP buffers the cached views point into: their tensors' identities and addresses."""
    return tuple(
        (id(b.grad_data), id(b.param_data), b.grad_data.data_ptr() if b.grad_data is not None else 0)
        for b in optimizer.buffers
    )


def _main_groups(optimizer: Any) -> list[tuple[list, list]]:
    """``(model groups, shard main groups)`` pairs in the order the host walks them (distrib_optimizer.py)."""
    return [
        (optimizer.model_float16_groups, optimizer.shard_fp32_from_float16_groups),
        (optimizer.model_fp32_groups, optimizer.shard_fp32_groups),
    ]


def _build_views(optimizer: Any, key: tuple) -> _ShardViews:
    config, ddp_config = optimizer.config, optimizer.ddp_config
    host_only = (
        optimizer.is_stub_optimizer
        or ddp_config.use_megatron_fsdp
        or config.use_precision_aware_optimizer_no_fp8_or_ds_fp8
    )
    if host_only:
        return _ShardViews(key=key, grads=None, copy_to=None, copy_from=None)
    grads: list[tuple[torch.Tensor, torch.Tensor]] | None = []
    copy_to: list[torch.Tensor] | None = []
    copy_from: list[torch.Tensor] | None = []
    quantized_gather = ddp_config.fp8_param_gather or ddp_config.fp4_param_gather
    for model_groups, shard_main_groups in _main_groups(optimizer):
        for model_group, shard_main_group in zip(model_groups, shard_main_groups, strict=True):
            for model_param, shard_main_param in zip(model_group, shard_main_group, strict=True):
                ranges = optimizer._get_model_param_range_map(model_param)
                model_grad = model_param.main_grad
                if grads is not None:
                    if model_grad.dtype != torch.float32:  # the host's .float() makes a copy: keep its path
                        grads = None
                    else:
                        grads.append(
                            (shard_main_param, model_grad.view(-1)[ranges["param"].start : ranges["param"].end])
                        )
                if copy_to is not None and copy_from is not None:
                    if quantized_gather or _quantized(optimizer, model_param):
                        copy_to = copy_from = None
                    else:
                        gbuf_index, _, bucket_id = optimizer.model_param_gbuf_map[model_param]
                        buffer = optimizer.buffers[gbuf_index].buckets[bucket_id].param_data
                        world = ranges["gbuf_world_in_bucket"]
                        copy_to.append(buffer.view(-1)[world.start : world.end].data)
                        copy_from.append(shard_main_param)
    from megatron.core.optimizer.optimizer import _get_param_grad_norm_group

    groups = [
        optimizer.model_float16_groups,
        optimizer.model_fp32_groups,
        optimizer.shard_float16_groups,
        optimizer.shard_fp32_groups,
        optimizer.shard_fp32_from_float16_groups,
    ]  # the groups the host's zero_grad walks (distrib_optimizer.py)
    return _ShardViews(
        key=key,
        grads=grads,
        copy_to=copy_to,
        copy_from=copy_from,
        separate_norm_groups=any(_get_param_grad_norm_group(p) is not None for p in optimizer.get_parameters()),
        has_params=bool(optimizer.get_parameters()),
        grad_params=[p for group_list in groups for group in group_list for p in group],
    )


def _quantized(optimizer: Any, model_param: torch.Tensor) -> bool:
    from megatron.core.fp4_utils import is_nvfp4tensor

    return bool(optimizer._is_distopt_quantized_param(model_param) or is_nvfp4tensor(model_param))


class CachedShardViews(HostABCMixin):  # abc.ABC at run time, for the layout (below)
    """Mixin for one megatron-core 0.19.2 ``DistributedOptimizer``: its per-parameter walks, cached.

    Overrides ``_copy_model_grads_to_main_grads``, ``get_grads_for_grad_norm``, ``get_grad_norm``,
    ``_copy_main_params_to_model_params`` and ``zero_grad`` (which also marks the cached gradients stale); everything
    else is the host's. Its clip list (``_bcg_clip_grads``) serves :class:`CachedChainedStep`, which does the clip:
    megatron-core's ``ChainedOptimizer`` never calls a member's own ``clip_grad_norm``, so that stays the host's.
    Adds one instance attribute, :data:`CACHE`.

    It derives from ``abc.ABC`` as ``MegatronOptimizer`` does: Python allows the ``__class__`` assignment of
    :func:`~bridge_cudagraph.host.instance_class.extend_instance_class` only between classes whose instance dict and
    weakref slots are added on top of the same base, and ``MegatronOptimizer`` adds them on top of ``ABC`` (a plain
    mixin adds them on top of ``object``: "object layout differs").
    """

    def _bcg_views(self) -> _ShardViews:
        key = _buffers_key(self)
        views = self.__dict__.get(CACHE)
        if views is None or views.key != key:  # first step, or a DDP buffer was replaced: take the views again
            previous = views
            views = self.__dict__[CACHE] = _build_views(self, key)
            views.cached_steps = previous.cached_steps if previous is not None else 0
        return views

    def _copy_model_grads_to_main_grads(self) -> None:
        views = self._bcg_views()
        if views.grads is None:
            views.grads_assigned = False
            return super()._copy_model_grads_to_main_grads()
        # The host's loop (distrib_optimizer.py) gives each shard main param its slice of main_grad as .grad
        # (``.float()`` of an fp32 slice is the slice): the same tensors here, without the per-parameter lookups.
        for shard_main_param, shard_model_grad in views.grads:
            shard_main_param.grad = shard_model_grad
        views.grads_assigned = True
        return None

    def get_grads_for_grad_norm(self, grad_norm_group=None) -> list[torch.Tensor]:
        views = self.__dict__.get(CACHE)
        if views is None or not views.grads_assigned:
            return super().get_grads_for_grad_norm(grad_norm_group)
        # The host filters on static parameter attributes and on .grad being set; with every main param holding its
        # cached view, its list is the same list of the same tensors on every step.
        cached = views.norm_lists.get(grad_norm_group)
        if cached is None:
            cached = views.norm_lists[grad_norm_group] = super().get_grads_for_grad_norm(grad_norm_group)
        return list(cached)

    def get_grad_norm(self):
        views = self.__dict__.get(CACHE)
        if views is None or not views.grads_assigned:
            return super().get_grad_norm()
        # The host's get_grad_norm (optimizer.py): get_grad_norm_fp32 of the norm list, whose per-gradient
        # DTensor checks find none in the cached list (plain views into the DDP buffers).
        return _l2_norm(self.get_grads_for_grad_norm(), self.get_grad_stats_parallel_group())

    def _bcg_clip_grads(self) -> list[torch.Tensor] | None:
        """The gradients ``clip_grad_by_total_norm_fp32`` would scale this step, or None where its walk must run."""
        views = self.__dict__.get(CACHE)
        if views is None or not views.grads_assigned or views.separate_norm_groups or not views.has_params:
            return None
        if views.clip_grads is None:
            views.clip_grads = [p.grad.detach() for p in self.get_parameters() if p.grad is not None]
        return views.clip_grads

    def _copy_main_params_to_model_params(self) -> None:
        views = self._bcg_views()
        if views.copy_to is None or views.copy_from is None:
            return super()._copy_main_params_to_model_params()
        # The host copies shard by shard (distrib_optimizer.py, one launch each); one multi-tensor copy writes
        # the same values (the same fp32 -> bf16 rounding) into the same slices.
        torch._foreach_copy_(views.copy_to, views.copy_from)
        if views.grads_assigned:
            views.cached_steps += 1
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        views = self.__dict__.get(CACHE)
        if views is None or not set_to_none or views.grads is None:
            if views is not None:
                views.grads_assigned = False
            return super().zero_grad(set_to_none)
        # The host's zero_grad(set_to_none=True) sets every .grad of its five groups that is not None to None.
        for param in views.grad_params:
            param.grad = None
        views.grads_assigned = False
        return None


def _l2_norm(grads: list[torch.Tensor], group: Any):
    """megatron-core 0.19.2's ``get_grad_norm_fp32`` (clip_grads.py) at norm 2 for plain (non-DTensor) gradients:
    the same kernel, overflow buffer, power, all-reduce and root."""
    from megatron.core.optimizer import clip_grads

    norm_type = 2.0
    total_norm = torch.zeros(1, dtype=torch.float, device="cuda")
    if grads:
        dummy_overflow_buf = torch.zeros(1, dtype=torch.int, device="cuda")
        grad_norm, _ = clip_grads.multi_tensor_applier(clip_grads.l2_norm_impl, dummy_overflow_buf, [grads], False)
        total_norm = grad_norm**norm_type
    torch.distributed.all_reduce(total_norm, op=torch.distributed.ReduceOp.SUM, group=group)
    if clip_grads.multi_tensor_scale_tensor_impl is not None:
        return total_norm.pow(1.0 / norm_type)
    return total_norm.item() ** (1.0 / norm_type)


def _scale_by_total_norm(grads: list[torch.Tensor], max_norm: float, total_norm) -> None:
    """The scale of megatron-core 0.19.2's ``clip_grad_by_total_norm_fp32`` (clip_grads.py), on its list of
    gradients: the same coefficient, kernel and overflow buffer."""
    from megatron.core.optimizer import clip_grads

    clip_coeff = max_norm / (total_norm + 1.0e-6)
    dummy_overflow_buf = torch.zeros(1, dtype=torch.int, device="cuda")
    if isinstance(clip_coeff, torch.Tensor):
        clip_coeff.clamp_max_(1.0)
        clip_grads.multi_tensor_applier(
            clip_grads.multi_tensor_scale_tensor_impl, dummy_overflow_buf, [grads, grads], clip_coeff
        )
    elif clip_coeff < 1.0:
        clip_grads.multi_tensor_applier(
            clip_grads.multi_tensor_scale_impl, dummy_overflow_buf, [grads, grads], clip_coeff
        )


# ------------------------------------------------------------------------------------ the chained optimizer
class CachedChainedStep(HostABCMixin):  # abc.ABC at run time, for the layout (as above)
    """Mixin for one megatron-core 0.19.2 ``ChainedOptimizer`` (what ``get_megatron_optimizer`` returns, also around
    a single distributed optimizer): its ``step`` without the per-parameter walks of the clip.

    The host's ``step`` (optimizer.py) computes the norm through its members and then clips each member by
    itself: ``get_parameters()``, a grad-norm-group lookup per parameter, and ``clip_grad_by_total_norm_fp32``, which
    walks the parameters again to list their gradients. With every member on the cached path
    (:class:`CachedShardViews`: no separate grad-norm group, no stub, no decoupled gradient) those lists are the
    members' cached ones; the coefficient, the kernel, the skip threshold and the order of the calls are the host's.
    Otherwise the step is the host's. The cache (:data:`CACHE`) counts the steps taken here.
    """

    def step(self):
        members = self.chained_optimizers
        if not all(isinstance(m, CachedShardViews) and _plain_member(m) for m in members):
            return super().step()
        self.grad_norms_by_group = {}
        found_inf_flag = self.prepare_grads()
        if found_inf_flag:
            return False, None, None
        grad_norm = self.get_grad_norm()
        should_skip_update = False
        if any(m.config.clip_grad > 0.0 for m in members):
            self._compute_grad_norms_by_group()
        for member in members:
            views = member.__dict__[CACHE]
            if not views.has_params:
                continue
            if member.config.clip_grad > 0.0:
                clip_grads = member._bcg_clip_grads()
                if clip_grads is None:  # this step's views were not assigned (a DDP buffer replaced): the host's walk
                    from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

                    clip_grad_by_total_norm_fp32(
                        member.get_parameters(), max_norm=member.config.clip_grad, total_norm=grad_norm
                    )
                else:
                    _scale_by_total_norm(clip_grads, member.config.clip_grad, grad_norm)
            threshold = member.config.grad_norm_skip_threshold
            if math.isfinite(threshold) and grad_norm > threshold:
                from megatron.core.optimizer import optimizer as host
                from megatron.core.utils import log_single_rank

                log_single_rank(host.logger, logging.INFO, "skipping grad norm because it's too large %s", grad_norm)
                should_skip_update = True
        num_zeros_in_grad = self.count_zeros() if self.config.log_num_zeros_in_grad else None
        update_successful = False if should_skip_update else self.step_with_ready_grads()
        self.__dict__[CACHE] = self.__dict__.get(CACHE, 0) + 1
        return update_successful, grad_norm, num_zeros_in_grad


def _plain_member(member: Any) -> bool:
    """A member whose part of the chained step :class:`CachedChainedStep` can take: views already taken (from an
    earlier step), with the main gradients as views, no separate grad-norm group, no stub and no decoupled
    gradient (precision-aware or Megatron-FSDP members keep ``grads=None``)."""
    views = member.__dict__.get(CACHE)
    return (
        views is not None
        and views.grads is not None
        and not views.separate_norm_groups
        and not getattr(member, "is_stub_optimizer", False)
        and not member.config.use_precision_aware_optimizer
    )


# ------------------------------------------------------------------------------------------- TE's FusedAdam
class CachedAdamLists(HostMixin):
    """Mixin for one Transformer Engine 2.20 ``FusedAdam``: the plain fp32 step without the per-parameter checks.

    The host's ``step`` (fused_adam.py) builds four tensor lists per parameter group through per-parameter state
    lookups, DTensor and quantization checks and ``get_unscaled_state`` calls, then launches ``multi_tensor_adam``.
    For fp32 parameters and fp32 state (what megatron-core's distributed optimizer hands it: the fp32 main shards)
    that is ``[grads, params, exp_avg, exp_avg_sq]``; this builds the lists in one tight loop and launches the same
    kernel with the same arguments, chunked as the host chunks. Anything else (capturable, master weights, decoupled
    gradients, a closure or grad scaler, bf16/fp8 state, a DTensor or quantized parameter, state not yet initialised)
    is the host's step.
    """

    def step(self, closure=None, grad_scaler=None):
        lists = None if closure is not None or grad_scaler is not None else _adam_lists(self)
        if lists is None:
            return super().step(closure, grad_scaler)
        from transformer_engine.pytorch.optimizers import fused_adam

        self.__dict__[CACHE] = self.__dict__.get(CACHE, 0) + 1  # steps on the listed path
        chunk = fused_adam._MAX_TENSORS_PER_MULTI_TENSOR_ADAM_CALL
        for group, tensor_lists in zip(self.param_groups, lists, strict=True):
            # The host advances the step before skipping an empty group (fused_adam.py).
            group["step"] = group["step"] + 1 if "step" in group else 1
            if tensor_lists is None:
                continue
            beta1, beta2 = group["betas"]
            for start in range(0, len(tensor_lists[0]), chunk):
                fused_adam.multi_tensor_applier(
                    self.multi_tensor_adam,
                    self._dummy_overflow_buf,
                    [tensors[start : start + chunk] for tensors in tensor_lists],
                    group["lr"],
                    beta1,
                    beta2,
                    group["eps"],
                    group["step"],
                    self.adam_w_mode,
                    1 if group["bias_correction"] else 0,
                    group["weight_decay"],
                )
        return None


def _adam_lists(adam: Any) -> list[list[list[torch.Tensor]] | None] | None:
    """Per group ``[grads, params, exp_avg, exp_avg_sq]`` (None for a group without a gradient), as the host's plain
    fp32 path collects them; None when this step must be the host's."""
    fp32 = torch.float32
    if adam.capturable or adam.master_weights or adam.use_decoupled_grad:
        return None
    if adam.name_to_dtype_map["exp_avg"] != fp32 or adam.name_to_dtype_map["exp_avg_sq"] != fp32:
        return None
    out: list[list[list[torch.Tensor]] | None] = []
    state = adam.state
    for group in adam.param_groups:
        g, p, m, v = [], [], [], []
        for param in group["params"]:
            # megatron-core's fp32 main shards are plain tensors (distrib_optimizer.py); other types: the host
            if type(param) not in (torch.Tensor, torch.nn.Parameter) or param.dtype != fp32:
                return None
            st = state.get(param)
            if not st:  # the host initialises the state on its first step
                return None
            grad = param.grad
            if grad is None:  # the host skips it
                continue
            exp_avg, exp_avg_sq = st["exp_avg"], st["exp_avg_sq"]
            if grad.is_sparse or type(exp_avg) is not torch.Tensor or type(exp_avg_sq) is not torch.Tensor:
                return None
            if grad.dtype != fp32 or exp_avg.dtype != fp32 or exp_avg_sq.dtype != fp32:
                return None
            g.append(grad.data)
            p.append(param.data)
            m.append(exp_avg)
            v.append(exp_avg_sq)
        out.append([g, p, m, v] if g else None)
    return out


# -------------------------------------------------------------------------------------------- install / undo
def _targets(optimizer: Any) -> list[tuple[Any, type]]:
    """``(object, mixin)`` for ``optimizer`` itself when it is a ``ChainedOptimizer``, and for every distributed
    optimizer and TE ``FusedAdam`` inside it."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    from megatron.core.optimizer.optimizer import ChainedOptimizer
    from transformer_engine.pytorch.optimizers import FusedAdam

    out: list[tuple[Any, type]] = []
    if isinstance(optimizer, ChainedOptimizer):
        out.append((optimizer, CachedChainedStep))
    for member in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        if isinstance(member, DistributedOptimizer):
            out.append((member, CachedShardViews))
        inner = getattr(member, "optimizer", None)
        if isinstance(inner, FusedAdam):
            out.append((inner, CachedAdamLists))
    return out


def install(optimizer: Any) -> list[tuple[Any, type]]:
    """Put the mixins in front of the optimizer objects inside ``optimizer``; returns what :func:`uninstall` takes
    off (empty where the installed megatron-core / TE is not the one these mixins mirror, logged once)."""
    if not compat.optimizer_step_is_mirrored():
        logger.warning(
            "bridge_cudagraph: model.cuda_graph.cached_walks.optimizer is off: it mirrors megatron-core %s and "
            "Transformer Engine %s (installed: %s, %s)",
            *compat.OPTIMIZER_STEP_MIRRORS,
            compat.installed_version("megatron-core"),
            compat.installed_version("transformer-engine"),
        )
        return []
    mixed_in = _targets(optimizer)
    for obj, mixin in mixed_in:
        extend_instance_class(obj, mixin)
    return mixed_in


def uninstall(mixed_in: list[tuple[Any, type]]) -> None:
    """Undo :func:`install` for the ``(object, mixin)`` pairs it returned: the host classes back, the caches
    dropped."""
    for obj, mixin in mixed_in:
        restore_instance_class(obj, mixin)
        obj.__dict__.pop(CACHE, None)


def installed(optimizer: Any) -> bool:
    """Whether :func:`install` has put a mixin on some object inside ``optimizer``."""
    return any(isinstance(obj, mixin) for obj, mixin in _targets(optimizer))


def cached_steps(optimizer: Any) -> dict[str, int]:
    """Steps each kind of object inside ``optimizer`` took on the cached path: ``distributed_optimizer`` (gradient
    views and the one-launch parameter copy), ``adam`` (the listed fused step) and, for a ``ChainedOptimizer``,
    ``chained`` (its step with the members' cached clip lists); what a test asserts is > 0."""
    out = {"distributed_optimizer": 0, "adam": 0, "chained": 0}
    for obj, mixin in _targets(optimizer):
        value = obj.__dict__.get(CACHE)
        if mixin is CachedShardViews and value is not None:
            out["distributed_optimizer"] += value.cached_steps
        elif mixin is CachedAdamLists and value is not None:
            out["adam"] += value
        elif mixin is CachedChainedStep:
            out["chained"] += value or 0
    return out
