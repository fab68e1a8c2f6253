"""Train with Megatron-Bridge's own loop and the plugin's graphs: what ``bridge-cudagraph train`` runs.

Nothing here replaces Bridge's loop. ``bridge-cudagraph train`` calls :func:`prepare` (the checks and the plan, once:
a :class:`Run`), then :meth:`Run.train`. :func:`run`, the loop's driver, plans where it is given no plan, the way
``validate`` does (:func:`bridge_cudagraph.plan.from_config.plan_config` on a copy: a configuration ``validate``
refuses is refused here with the same line, before any process group or step), then installs
:mod:`bridge_cudagraph.bridge.loop`'s helper (:func:`~bridge_cudagraph.bridge.loop.install_bridge_helper`, so
Bridge's own language capture stays inert), adds
:class:`~bridge_cudagraph.bridge.callback.CudaGraphCallback` (which owns capture, hooks, counters and teardown), picks
Bridge's forward step for the model family, and calls Bridge's ``pretrain()``, or ``finetune()`` when the recipe names
a pretrained checkpoint. Under ``torchrun`` every rank runs it; Bridge initialises ``torch.distributed`` from the
environment.

How a run ends, and who deletes the graphs first (Bridge 0.6.2; the teardown GPU test runs each ending 10 times):

* **normally**: Bridge's ``_delete_cuda_graphs`` after the loop (``train.py``) reaches the callback through
  :mod:`bridge_cudagraph.bridge.loop`; ``on_train_end`` (idempotent) follows; then Bridge destroys its state and
  process groups and ``run`` returns.
* **by an exception** in the loop (a step, a callback, a data loader): Bridge's ``_pretrain`` catches it and aborts
  the process groups (``pretrain.py``) before re-raising, and no callback event fires. So :func:`run`
  calls the loop through :func:`~bridge_cudagraph.host.training_loop.release_graphs_if_training_raises`, which deletes
  the graphs *before* that clean-up and re-raises: the exception is never swallowed, the process exits non-zero
  with it.
* **by SIGTERM** (Slurm ``scancel``, preemption, torchrun forwarding its own SIGTERM): with
  ``train.exit_signal_handler=true`` (the tiny recipe sets it) Bridge notes the signal, finishes the step, saves a
  checkpoint when ``checkpoint.save`` is set, leaves the loop through ``_delete_cuda_graphs`` (graphs deleted) and
  ``sys.exit(0)``; that ``SystemExit`` passes the same wrapper (nothing left to delete) and Bridge's clean-up. The
  worker exits 0; torchrun itself, having been signalled, exits 1 (``SignalException``) once its worker has gone,
  and SIGKILLs a worker still alive after ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` (default 30 s; it must cover the
  checkpoint save, as Slurm's KillWait must; the save's ``spawn`` child re-imports the launching script, which
  costs nothing for this CLI and a second import of the whole stack for a script that imports it at module level:
  ``tests/unit/test_cli.py``). Without the handler (Bridge's default) SIGTERM's default action ends the worker at
  once: the kernel frees the device, nothing can hang, but no graph is deleted and no checkpoint is saved.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bridge_cudagraph.bridge.callback import CudaGraphCallback
from bridge_cudagraph.bridge.data_path import DataWait, observing_forward_step
from bridge_cudagraph.bridge.loop import install_bridge_helper
from bridge_cudagraph.bridge.throughput import ThroughputCallback, UsefulTokenMeter
from bridge_cudagraph.host.data_workers import fork_safe_tokenizers
from bridge_cudagraph.host.dataset_helpers import use_prebuilt_dataset_helpers
from bridge_cudagraph.host.training_loop import release_graphs_if_training_raises
from bridge_cudagraph.plan.from_config import plan_config, world_size_from_env
from bridge_cudagraph.vision import cpu_grids

if TYPE_CHECKING:
    from bridge_cudagraph.plan.capture_plan import CapturePlan


def forward_step_for(model_config: Any) -> Callable:
    """Bridge's forward step for the provider: ``qwen3_vl_step`` for Qwen3-VL (dense and MoE), else ``gpt_step``."""
    from megatron.bridge.models.qwen_vl.qwen3_vl_provider import Qwen3VLModelProvider, Qwen3VLMoEModelProvider

    if isinstance(model_config, Qwen3VLModelProvider | Qwen3VLMoEModelProvider):
        from megatron.bridge.models.qwen_vl.qwen3_vl_step import forward_step
    else:
        from megatron.bridge.training.gpt_step import forward_step
    return forward_step


def run(
    config: Any,
    *,
    plan: CapturePlan | None = None,
    callbacks: Sequence[Any] = (),
    forward_step_func: Callable | None = None,
) -> None:
    """Run Bridge's training loop on ``config`` (a ``ConfigContainer``) with the plugin's graph lifecycle.

    Args:
        config: The Bridge ``ConfigContainer`` (e.g. ``load_recipe(...).config``), not finalized: Bridge does that.
        plan: Its capture plan (``plan_config(config, world_size=..., copy=True)``), which the callback builds the
            helpers from; planned here when not given, so a configuration ``validate`` refuses is refused before any
            step either way.
        callbacks: More Bridge callbacks, fired after the plugin's.
        forward_step_func: Override of :func:`forward_step_for`.
    """
    if plan is None:
        plan = plan_config(config, world_size=world_size_from_env(), copy=True)
    from megatron.bridge.training.finetune import finetune
    from megatron.bridge.training.pretrain import pretrain
    from megatron.bridge.utils.common_utils import print_rank_0

    install_bridge_helper()
    use_prebuilt_dataset_helpers()
    graph_callback = CudaGraphCallback(plan=plan)
    meter, data_wait = UsefulTokenMeter(), DataWait()
    # Each micro-batch seen on the CPU as the collate made it: its loss tokens counted, its vision grids kept in the
    # step's micro-batch for the forward that reads them (vision.cpu_grids), until the step returns; each draw's wait
    # timed.
    step = observing_forward_step(
        forward_step_func or forward_step_for(config.model), [meter.add, cpu_grids.record_collated], wait=data_wait
    )
    # Measured after the capture step and the first replay (graphed and eager runs alike): warmup, capture and
    # one-time set-up are not training speed.
    warmup = max(plan.language.warmup_steps, plan.vision.warmup_steps if plan.vision is not None else 0)
    throughput = ThroughputCallback(meter, skip_iterations=warmup + 2, wait=data_wait)
    finetuning = config.checkpoint.pretrained_checkpoint is not None
    entry = finetune if finetuning else pretrain
    block = getattr(config.model, "cuda_graph", None)
    graphs = "not a bridge_cudagraph provider"
    if block is not None:
        graphs = " ".join(f"{n}={'on' if getattr(block, n).enabled else 'off'}" for n in ("language", "vision"))
    print_rank_0(
        f"bridge_cudagraph: Megatron-Bridge {entry.__name__}() of {type(config.model).__name__} "
        f"({config.train.train_iters} iterations, graphs: {graphs}); process groups, model, optimizer and data "
        "are set up first, which can take a few minutes on large models"
    )
    print_rank_0(plan.describe())
    started = time.perf_counter()
    workers = getattr(getattr(config, "dataset", None), "num_workers", 0)
    try:
        with release_graphs_if_training_raises(graph_callback), fork_safe_tokenizers(workers):
            entry(config, forward_step_func=step, callbacks=[graph_callback, throughput, *callbacks])
    except BaseException as error:
        # Backstop for anything the loop wrapper did not see (idempotent: usually nothing is left); re-raised as is.
        graph_callback.release_graphs(reason=f"{entry.__name__}() raised {type(error).__name__}")
        raise
    print_rank_0(f"bridge_cudagraph: {entry.__name__}() finished in {time.perf_counter() - started:.0f} s")


@dataclass(frozen=True)
class Run:
    """One training run, checked and planned once (:func:`prepare`): the loaded recipe, its plan and the GPU memory
    it must fit. :meth:`train` is the rest of ``bridge-cudagraph train``."""

    loaded: Any
    """The ``LoadedRecipe`` (its ``.config`` a ``ConfigContainer`` with every override applied)."""
    plan: CapturePlan
    gpu_memory: float | None = None
    """``--gpu-memory`` GiB: the process is capped at it and the plan checked against it (None: the device's)."""

    def train(self) -> int:
        """Cap the device (:func:`cap_device_memory`), then Bridge's loop with the plan's graphs (:func:`run`)."""
        cap_device_memory(self.plan, self.gpu_memory)
        run(self.loaded.config, plan=self.plan)
        return 0


def prepare(loaded: Any, *, gpu_memory: float | None = None) -> Run:
    """What ``train`` does before its GPU check, once: the plan (every config check ``validate`` makes), so a refused
    configuration gets the same ``error:`` line on any machine; returns the :class:`Run`.

    Nothing has run yet, so whatever Bridge or Megatron-Core refuse here (``ValueError``, ``AssertionError``) is a
    configuration error too: the CLI calls this in its configuration phase, which says it in one line with the
    settings the host's check reads (it keeps tracebacks for failures of the run itself).

    The checks ``validate`` and ``plan`` leave out, being about this run or machine, are made here: a PEFT base
    checkpoint (``checkpoint.pretrained_checkpoint``) that is not set or not on this machine, which Bridge would refuse
    naming no setting or with the path alone (``PEFT requires a pretrained checkpoint path``,
    ``CheckpointConfig.finalize``; the line says which setting to give and how to build one), and what its installed
    stack cannot build (:func:`~bridge_cudagraph.plan.checks.check_stack`). ``gpu_memory``: the ``--gpu-memory`` GiB
    the run must fit (:func:`bridge_cudagraph.plan.memory.check_plan_fits`), checked here against the plan's estimate
    like ``validate`` does.
    """
    from bridge_cudagraph.config import CudaGraphConfigError
    from bridge_cudagraph.plan.checks import check_stack
    from bridge_cudagraph.plan.from_config import absent_base_checkpoint, missing_base_checkpoint

    missing = absent_base_checkpoint(loaded.config)
    overrides = "".join(f" {o}" for o in getattr(loaded, "overrides", ()))
    build = f"python -m bridge_cudagraph.examples.random_base {loaded.source}{overrides}"
    if missing is not None:
        raise CudaGraphConfigError(
            f"checkpoint.pretrained_checkpoint={missing} does not exist on this machine: Bridge's fine-tuning loads "
            "the base weights from it (PEFT before applying the adapters); give an existing Megatron or Hugging "
            f"Face checkpoint, or build one with random weights: {build}"
        )
    if missing_base_checkpoint(loaded.config) is not None:  # PEFT, and no path at all
        peft = type(loaded.config.peft).__name__
        raise CudaGraphConfigError(
            f"checkpoint.pretrained_checkpoint is not set, and this recipe's PEFT ({peft}) trains adapters on a base "
            "checkpoint: give checkpoint.pretrained_checkpoint=PATH (a Megatron or Hugging Face checkpoint of the "
            f"model), or build one with random weights at PATH: {build} checkpoint.pretrained_checkpoint=PATH"
        )
    plan = plan_config(loaded.config, world_size=world_size_from_env(), copy=True)
    check_stack(loaded.config)
    if gpu_memory is not None:
        from bridge_cudagraph.plan.memory import check_plan_fits

        check_plan_fits(plan, gpu_memory, source=f"--gpu-memory {gpu_memory:g}")
    return Run(loaded, plan, gpu_memory)


def cap_device_memory(plan: CapturePlan, gpu_memory: float | None) -> None:
    """Before the first step: with ``--gpu-memory GIB``, cap this process's CUDA allocations at GIB
    (``torch.cuda.set_per_process_memory_fraction``: an allocation past it fails as on a GPU of that size, so an 80 GB
    H100 is emulated on a larger one); then refuse, with one line, a plan whose estimate does not fit the device as
    capped. The device is the rank's own (``LOCAL_RANK``, set by torchrun), which Bridge selects the same way.

    The fraction caps PyTorch's caching allocator only: the CUDA context, NCCL's communicators and the libraries'
    workspaces sit outside it (a few GiB on one GPU with the groups' communicators created at first use, as Bridge
    creates them, each of them about half a GiB even with one rank), so a run that fits the cap on a larger GPU can
    still fail on a GPU of the cap's size by that much (``results/fits-80gib/``)."""
    import os

    import torch

    from bridge_cudagraph.plan.memory import check_plan_fits

    if not torch.cuda.is_available():  # the CLI refused train without a GPU already; nothing to cap
        return
    device = int(os.environ.get("LOCAL_RANK", "0") or 0)
    total = torch.cuda.get_device_properties(device).total_memory
    gib = total / 2**30
    source = f"this GPU ({torch.cuda.get_device_name(device)})"
    if gpu_memory is not None:
        torch.cuda.set_per_process_memory_fraction(min(1.0, gpu_memory * 2**30 / total), device)
        gib, source = min(gib, gpu_memory), f"--gpu-memory {gpu_memory:g} on {source}"
    check_plan_fits(plan, gib, source=source)
