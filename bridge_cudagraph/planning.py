"""From a Bridge ``ConfigContainer`` to its :class:`~bridge_cudagraph.plan.CapturePlan`: the one path every verb takes.

``validate``, ``plan`` and ``train`` all reach the plan through :func:`plan_config`, so a configuration that one
refuses, the others refuse with the same line, and what ``plan`` prints is what ``train`` captures. The steps:

1. the run's sizes (:func:`~bridge_cudagraph.sizes.check_sizes`: Bridge divides by them before it checks them);
   then Bridge's own ``runtime_config_update`` at the run's world size (mixed precision, data-parallel size,
   ``ConfigContainer.validate``, which calls the provider's ``finalize()`` and so the mixin's checks); Bridge reads
   the world size from ``WORLD_SIZE`` and exports the recipe's ``env_vars``: both are restored afterwards;
2. the run-level checks of :func:`bridge_cudagraph.validation.check_run` (data loader, packing, padding);
3. :func:`~bridge_cudagraph.plan.build_plan` on the finalized model.

No process group, model or GPU is touched: this runs on a laptop for 64 GPUs, and in ``train`` before the CUDA check.
``train`` plans a deep copy (:func:`plan_copy`) and hands Bridge the untouched config, which ``pretrain()``
finalizes once itself, the same way; the callback then checks the model it built against the plan.
"""

from __future__ import annotations

import copy
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bridge_cudagraph.plan import CapturePlan

__all__ = ["plan_config", "plan_copy", "plan_finalized", "world_size_from_env"]


def world_size_from_env(environ: dict[str, str] | None = None) -> int:
    """The job's ranks as torchrun and Bridge (before ``torch.distributed`` exists) see them: ``WORLD_SIZE``."""
    env = os.environ if environ is None else environ
    return int(env.get("WORLD_SIZE", "1") or 1)


def plan_finalized(config: Any, *, world_size: int) -> CapturePlan:
    """The run-level checks and the plan of a config Bridge has already finalized (steps 2 and 3)."""
    from bridge_cudagraph.plan import build_plan, model_facts
    from bridge_cudagraph.validation import check_run

    packing = check_run(config)
    return build_plan(
        model_facts(config.model, mixed_precision=config.mixed_precision),
        config.model.cuda_graph,
        world_size=world_size,
        micro_batch_size=config.train.micro_batch_size,
        global_batch_size=config.train.global_batch_size,
        packing=packing,
    )


def plan_config(config: Any, *, world_size: int) -> CapturePlan:
    """Finalize ``config`` in place as Bridge's training does at ``world_size`` ranks, check it and plan it.

    Raises:
        CudaGraphConfigError, LayoutError: The plugin refuses the configuration (one line: setting and fix).
        ValueError, AssertionError: Bridge or Megatron-Core refuse it.
    """
    from megatron.bridge.training.config import runtime_config_update

    from bridge_cudagraph.sizes import check_sizes

    check_sizes(config, world_size)  # before Bridge's runtime_config_update divides by them
    saved = dict(os.environ)
    os.environ["WORLD_SIZE"] = str(world_size)
    try:
        runtime_config_update(config)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return plan_finalized(config, world_size=world_size)


def plan_copy(config: Any, *, world_size: int) -> CapturePlan:
    """:func:`plan_config` on a deep copy: ``config`` stays as it was, for Bridge's ``pretrain()`` to finalize."""
    return plan_config(copy.deepcopy(config), world_size=world_size)
