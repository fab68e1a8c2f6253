"""From a Bridge ``ConfigContainer`` to its :class:`~bridge_cudagraph.plan.capture_plan.CapturePlan`: the one path
every verb takes.

``validate``, ``plan`` and ``train`` all reach the plan through :func:`plan_config`, so a configuration that one
refuses, the others refuse with the same line, and what ``plan`` prints is what ``train`` captures. The steps:

1. the run's sizes (:func:`~bridge_cudagraph.plan.sizes.check_sizes`: Bridge divides by them before it checks them),
   and what Bridge would refuse with a line that names no setting
   (:func:`~bridge_cudagraph.plan.checks.check_before_bridge`); then Bridge's own ``runtime_config_update`` at the
   run's world size (mixed precision, data-parallel size, ``ConfigContainer.validate``, which calls the provider's
   ``finalize()`` and so the mixin's checks); Bridge reads the world size from ``WORLD_SIZE`` and exports the recipe's
   ``env_vars``: both are restored afterwards;
2. the run-level checks of :func:`bridge_cudagraph.plan.checks.check_run` (data loader, packing, padding);
3. :func:`~bridge_cudagraph.plan.build.build_plan` on the finalized model, with what the data path packs and the most
   pixels it gives one image (:func:`~bridge_cudagraph.plan.facts.image_facts`);
4. :func:`~bridge_cudagraph.plan.replay.check_replays`: every graph of the plan can replay in a run of this length
   on this data path, and the estimate fits some GPU.

No process group, model or GPU is touched: this runs on a laptop for 64 GPUs, and in ``train`` before the CUDA check.
``train`` plans a deep copy (``copy=True``) and hands Bridge the untouched config, which ``pretrain()``
finalizes once itself, the same way; the callback then checks the model it built against the plan.

Two of Bridge's checks are about the run, not its plan: a PEFT recipe names a base checkpoint
(``checkpoint.pretrained_checkpoint``: ``PEFT requires a pretrained checkpoint path``, ``ConfigContainer.validate``),
and it exists (``CheckpointConfig.finalize``, Bridge 0.6.2 ``config.py``). A plan never reads it, and the
17 GB base of an 8B model is rarely on the laptop that plans a run, so ``validate`` and ``plan`` pass
``base_checkpoint_needed=False``: a base checkpoint that is not set (PEFT) or not on this machine is replaced by an
empty folder for the length of Bridge's finalization only (:func:`missing_base_checkpoint` says which, and the CLI
says so); every other check runs as it is. ``train`` keeps the check (the default). So it is with the installed
stack: what this machine cannot build (:func:`bridge_cudagraph.plan.checks.check_stack`, e.g. a fusion that needs
APEX) is refused by ``train`` and the random base builder, which build here, not by a plan made for another machine.
"""

from __future__ import annotations

import contextlib
import copy as _copy
import os
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bridge_cudagraph.plan.capture_plan import CapturePlan
    from bridge_cudagraph.plan.memory import TrainingFacts

__all__ = [
    "absent_base_checkpoint",
    "finalize_config",
    "missing_base_checkpoint",
    "plan_config",
    "world_size_from_env",
]


def world_size_from_env(environ: dict[str, str] | None = None) -> int:
    """The job's ranks as torchrun and Bridge (before ``torch.distributed`` exists) see them: ``WORLD_SIZE``."""
    env = os.environ if environ is None else environ
    return int(env.get("WORLD_SIZE", "1") or 1)


def _plan_finalized(config: Any, *, world_size: int) -> CapturePlan:
    """Steps 2 and 3: the run-level checks and the plan of a finalized config."""
    from bridge_cudagraph.plan.build import build_plan
    from bridge_cudagraph.plan.checks import check_run
    from bridge_cudagraph.plan.facts import image_facts, model_facts
    from bridge_cudagraph.plan.replay import check_replays

    packing = check_run(config)
    facts = model_facts(config.model, mixed_precision=config.mixed_precision)
    images = image_facts(config) if facts.vision is not None else None
    plan = build_plan(
        facts,
        config.model.cuda_graph,
        world_size=world_size,
        micro_batch_size=config.train.micro_batch_size,
        global_batch_size=config.train.global_batch_size,
        packing=packing,
        training=training_facts(config, world_size=world_size),
        images=images,
    )
    check_replays(plan, train_iters=getattr(config.train, "train_iters", None), images=images)
    return plan


def training_facts(config: Any, *, world_size: int) -> TrainingFacts:
    """What the run's optimizer, gradient buffers and PEFT add to the weights' memory
    (:class:`~bridge_cudagraph.plan.memory.TrainingFacts`), read off a finalized ``ConfigContainer``."""
    from bridge_cudagraph.plan.memory import TrainingFacts

    model = config.model
    model_parallel = (
        int(model.tensor_model_parallel_size or 1)
        * int(getattr(model, "pipeline_model_parallel_size", 1) or 1)
        * int(getattr(model, "context_parallel_size", 1) or 1)
    )
    optimizer, ddp = getattr(config, "optimizer", None), getattr(config, "ddp", None)
    return TrainingFacts(
        dp=max(1, world_size // model_parallel),
        distributed_optimizer=bool(getattr(optimizer, "use_distributed_optimizer", False)),
        grad_bytes=4 if getattr(ddp, "grad_reduce_in_fp32", True) else 2,
        peft=getattr(config, "peft", None) is not None,
    )


def absent_base_checkpoint(config: Any) -> str | None:
    """``checkpoint.pretrained_checkpoint`` when a recipe names one that is not on this machine, else None.

    "Not on this machine" is Bridge's own test of it (``file_exists``, as ``CheckpointConfig.finalize`` asks).
    """
    checkpoint = getattr(config, "checkpoint", None)
    path = getattr(checkpoint, "pretrained_checkpoint", None)
    if path is None:
        return None
    from megatron.bridge.training.utils.checkpoint_utils import file_exists

    return None if file_exists(str(path)) else str(path)


def missing_base_checkpoint(config: Any) -> str | None:
    """What a run of ``config`` lacks of its base checkpoint, in words (None: nothing): for a PEFT recipe that names
    none, ``checkpoint.pretrained_checkpoint is not set``; for one not on this machine
    (:func:`absent_base_checkpoint`), ``checkpoint.pretrained_checkpoint=PATH is not on this machine``."""
    path = absent_base_checkpoint(config)
    if path is not None:
        return f"checkpoint.pretrained_checkpoint={path} is not on this machine"
    checkpoint = getattr(config, "checkpoint", None)
    if getattr(config, "peft", None) is not None and getattr(checkpoint, "pretrained_checkpoint", None) is None:
        return "checkpoint.pretrained_checkpoint is not set"
    return None


@contextlib.contextmanager
def _stand_in_base_checkpoint(config: Any, needed: bool) -> Iterator[None]:
    """For ``needed=False``: an empty folder in place of a base checkpoint that is missing
    (:func:`missing_base_checkpoint`), restored on leaving."""
    if needed or missing_base_checkpoint(config) is None:
        yield
        return
    path = config.checkpoint.pretrained_checkpoint
    with tempfile.TemporaryDirectory(prefix="bridge_cudagraph_no_base_") as stand_in:
        config.checkpoint.pretrained_checkpoint = stand_in
        try:
            yield
        finally:
            config.checkpoint.pretrained_checkpoint = path


def finalize_config(config: Any, *, world_size: int, base_checkpoint_needed: bool = True) -> None:
    """Step 1 alone: the run's sizes, then Bridge's ``runtime_config_update`` at ``world_size`` ranks, in place.

    Args:
        config: The Bridge ``ConfigContainer``.
        world_size: Ranks of the run.
        base_checkpoint_needed: False: a base checkpoint that is not set (PEFT) or not on this machine does not stop
            the finalization (see the module docstring); the config keeps its path, or its None.
    """
    from megatron.bridge.training.config import runtime_config_update

    from bridge_cudagraph.host.compat import check_proven_stack
    from bridge_cudagraph.plan.checks import check_before_bridge
    from bridge_cudagraph.plan.sizes import check_sizes

    check_proven_stack()  # before anything of the host runs on the config
    check_sizes(config, world_size)  # before Bridge's runtime_config_update divides by them
    check_before_bridge(config)  # before Bridge's own lines, which name no setting
    saved = dict(os.environ)
    os.environ["WORLD_SIZE"] = str(world_size)
    try:
        with _stand_in_base_checkpoint(config, base_checkpoint_needed):
            runtime_config_update(config)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def plan_config(
    config: Any,
    *,
    world_size: int,
    copy: bool = False,
    finalized: bool = False,
    base_checkpoint_needed: bool = True,
) -> CapturePlan:
    """The one way to a plan from a Bridge ``ConfigContainer``, for every verb, the callback and the benchmark.

    Args:
        config: The Bridge ``ConfigContainer``.
        world_size: Ranks of the run.
        copy: Plan a deep copy and leave ``config`` as it was (``train``: Bridge's ``pretrain()`` finalizes it).
        finalized: Bridge has finalized ``config`` already (the callback, inside ``pretrain()``): steps 2 and 3
            only, on the config as it is.
        base_checkpoint_needed: See :func:`finalize_config`; ``validate`` and ``plan`` pass False.

    Raises:
        CudaGraphConfigError, LayoutError: The plugin refuses the configuration (one line: setting and fix).
        ValueError, AssertionError: Bridge or Megatron-Core refuse it.
    """
    if copy:
        config = _copy.deepcopy(config)
    if not finalized:
        finalize_config(config, world_size=world_size, base_checkpoint_needed=base_checkpoint_needed)
    return _plan_finalized(config, world_size=world_size)
