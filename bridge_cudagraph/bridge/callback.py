"""``CudaGraphCallback``: the graphs' lifecycle inside Megatron-Bridge's training loop.

Pass it to ``pretrain()``/``finetune()`` (:func:`bridge_cudagraph.bridge.train.run` does); constructing it installs
:mod:`bridge_cudagraph.bridge.loop`, so Bridge's own capture stays inert and this callback is the one owner.

What happens when (Bridge 0.6.2 ``megatron/bridge/training/train.py``):

* ``on_train_start`` (``train.py``, after the model is in train mode, before the loop): build the provider's
  helpers (:meth:`~bridge_cudagraph.bridge.mixin.CudaGraphProviderMixin.make_graph_helpers`) from the run's
  :class:`~bridge_cudagraph.plan.capture_plan.CapturePlan` (budgets, copies, micro-batches, warmups: nothing
  re-derived), and remember the start step: the loaded iteration on resume, so a resumed run captures again
  ``warmup`` steps later.
* ``on_train_step_start`` (``train.py``, after Bridge's (inert) capture block, before the step): at the first
  step with ``step - start >= warmup`` capture each submodule. With the distributed optimizer and
  ``overlap_param_gather`` the DDP forward pre-hooks are disabled around capture (as Bridge does,
  ``train.py``) when they are on, and the graphs' manual hooks are set once the pre-hooks are on: right
  after capture, or, with ``warmup == 0``, at the next step, after Bridge has enabled them (``train.py``).
  ``>=`` rather than Bridge's ``==``: an iteration Bridge skips (``iterations_to_skip``) never reaches the
  callbacks, and capture must not be lost with it.
* ``on_train_step_end``: count, and every ``logger.log_interval`` iterations report the counters (rank-0 line;
  TensorBoard / W&B when Bridge has a writer).
* evaluation needs nothing: Bridge's ``evaluate`` puts every chunk in eval mode (``eval.py``) and back
  (``eval.py``); megatron-core routes a layer to its TE graph only when ``self.training``
  (``transformer/module.py``), and TE's graphed forward falls back to eager when the module's mode differs
  from capture (``transformer_engine/pytorch/graph.py``). So evaluation runs eagerly, and training replays
  again afterwards.
* ``on_train_end`` (``train.py``) and Bridge's ``_delete_cuda_graphs`` (``train.py``, reached through
  :class:`~bridge_cudagraph.bridge.loop.CallbackOwnedGraphs` also on the early-exit path that skips
  ``on_train_end``: ``exit_interval``, ``exit_duration_in_mins`` and, with ``train.exit_signal_handler``, SIGTERM):
  delete every graph. Both come before Bridge destroys its global state and process groups (``pretrain.py``), so
  graphs holding NCCL buffers cannot hang the exit.
* when the training loop raises (an exception, or Bridge's own ``sys.exit`` of the early-exit path), Bridge's
  ``_pretrain`` aborts the process groups in its ``except`` (``pretrain.py``) and no event fires;
  :func:`bridge_cudagraph.host.training_loop.release_graphs_if_training_raises` wraps the loop so that
  :meth:`release_graphs` runs first (:func:`bridge_cudagraph.bridge.train.run` installs it).

Every :meth:`CudaGraphCallback.release_graphs` call is logged in ``CudaGraphCallback.releases`` (why, what was
deleted, whether ``torch.distributed`` was still initialised), which the teardown tests read.

The decisions are in :class:`GraphLifecycle` and small pure functions, which the CPU tests drive with fake
helpers and a fake loop; the callback only translates Bridge's ``CallbackContext`` into them.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from megatron.bridge.training.callbacks import Callback

from bridge_cudagraph.bridge import loop as bridge_loop
from bridge_cudagraph.host.bridge_helper import bridge_helper_installed

if TYPE_CHECKING:
    from bridge_cudagraph.host.step import StepHostCaches
    from bridge_cudagraph.plan.capture_plan import CapturePlan

logger = logging.getLogger("bridge_cudagraph")

_MIB = 2**20


class PreHooks(Protocol):
    """The DDP forward pre-hooks of the model chunks, as the lifecycle needs to see and toggle them."""

    @property
    def enabled(self) -> bool:
        """Whether the pre-hooks are registered now."""
        ...

    def disable(self) -> None:
        """Remove them, without a parameter sync (capture must not start collectives)."""
        ...

    def enable(self) -> None:
        """Register them again."""
        ...


class ForwardPreHooks:
    """:class:`PreHooks` of Megatron DDP chunks, toggled with Bridge's own functions."""

    def __init__(self, model: Sequence[Any]) -> None:
        self.model = list(model)

    @property
    def enabled(self) -> bool:
        """Megatron DDP keeps one removal handle per hooked module while the pre-hooks are on."""
        return any(getattr(chunk, "remove_forward_pre_hook_handles", None) for chunk in self.model)

    def disable(self) -> None:
        """``train.disable_forward_pre_hook(model, param_sync=False)``, as Bridge around its capture."""
        from megatron.bridge.training.train import disable_forward_pre_hook

        disable_forward_pre_hook(self.model, param_sync=False)

    def enable(self) -> None:
        """``train.enable_forward_pre_hook(model)``."""
        from megatron.bridge.training.train import enable_forward_pre_hook

        enable_forward_pre_hook(self.model)


class Phase(enum.Enum):
    """Where one helper is in its lifecycle."""

    PENDING = "pending"
    """Waiting for its warmup steps."""
    CAPTURED = "captured"
    """Graphs exist and replay in training steps."""
    EMPTY = "empty"
    """Capture ran and found nothing to graph on this rank (e.g. no graphable layer on this pipeline stage)."""
    FAILED = "failed"
    """Capture failed; the submodule trains eagerly."""
    DELETED = "deleted"
    """Graphs freed at the end of training."""


@dataclass
class GraphSlot:
    """One helper (one submodule's graphs) and what the lifecycle did with it."""

    helper: Any
    submodule: str
    warmup: int
    phase: Phase = Phase.PENDING
    captured_at: int | None = None
    manual_hooks: bool = False
    graphed_steps: int = 0
    failure: str | None = None

    def counters(self) -> dict[str, int]:
        """The numbers reported every ``log_interval``."""
        stats = getattr(self.helper, "stats", None)
        return {
            "graphs": int(getattr(stats, "graphs", 0)),
            "graphed_steps": self.graphed_steps,
            "replays": int(getattr(stats, "replays", 0)),
            "eager_fallbacks": int(getattr(stats, "eager_fallbacks", 0)),
        }


class GraphLifecycle:
    """When to capture, when to set manual hooks, what to delete: for every helper of one training run.

    Args:
        slots: One :class:`GraphSlot` per helper, language first.
        start_step: The loop's first step (the loaded iteration when resuming).
        toggles_pre_hooks: Whether the run uses DDP forward pre-hooks (distributed optimizer with
            ``overlap_param_gather``, no FSDP): Bridge's ``should_disable_forward_pre_hook``.
        on_capture_error: ``"eager"``: a helper that raises is logged once and left eager; ``"raise"``: re-raise.
    """

    def __init__(
        self,
        slots: Sequence[GraphSlot],
        *,
        start_step: int,
        toggles_pre_hooks: bool,
        on_capture_error: str = "eager",
    ) -> None:
        self.slots = list(slots)
        self.start_step = start_step
        self.toggles_pre_hooks = toggles_pre_hooks
        self.on_capture_error = on_capture_error

    def due(self, step: int) -> list[GraphSlot]:
        """The slots to capture before training step ``step``."""
        return [s for s in self.slots if s.phase is Phase.PENDING and step - self.start_step >= s.warmup]

    def capture(self, step: int, hooks: PreHooks) -> list[GraphSlot]:
        """Capture every due slot, the pre-hooks off around it when they are on; returns the slots attempted."""
        due = self.due(step)
        if not due:
            return []
        toggle = self.toggles_pre_hooks and hooks.enabled
        if toggle:
            hooks.disable()
        try:
            for slot in due:
                self._capture_one(slot, step)
        finally:
            if toggle:
                hooks.enable()
        return due

    def _capture_one(self, slot: GraphSlot, step: int) -> None:
        slot.captured_at = step
        try:
            slot.helper.create_cudagraphs()
        except Exception as error:
            slot.phase = Phase.FAILED
            slot.failure = f"{type(error).__name__}: {error}".splitlines()[0][:500]
            if self.on_capture_error == "raise":
                raise
            logger.warning(
                "bridge_cudagraph: %s capture failed, training on eagerly. Cause: %s", slot.submodule, slot.failure
            )
            return
        if slot.helper.graphs_created():
            slot.phase = Phase.CAPTURED
            return
        # The helper handled its own failure (and warned, see capture.failure.abandon_capture), or had nothing to do.
        slot.failure = getattr(getattr(slot.helper, "stats", None), "failed", None)
        slot.phase = Phase.FAILED if slot.failure else Phase.EMPTY

    def grow(self, hooks: PreHooks) -> list[tuple[GraphSlot, tuple[int, ...]]]:
        """Capture the budgets that micro-batches above a ladder's captured top asked for in earlier steps
        (:class:`~bridge_cudagraph.capture.budget_ladder.BudgetLadder`), the pre-hooks off around it as for a first
        capture.

        Before a step no micro-batch is in flight and the gradient buffers hold nothing the optimizer still needs
        (the capture's warmups write into them and are zeroed after). Returns what each slot captured."""
        todo = [s for s in self.slots if s.phase is Phase.CAPTURED and getattr(s.helper, "pending_budgets", None)]
        todo = [s for s in todo if s.helper.pending_budgets()]
        if not todo:
            return []
        toggle = self.toggles_pre_hooks and hooks.enabled
        if toggle:
            hooks.disable()
        grown = []
        try:
            for slot in todo:
                grown.append((slot, tuple(slot.helper.capture_pending())))
        finally:
            if toggle:
                hooks.enable()
        return grown

    def set_manual_hooks(self, hooks: PreHooks) -> list[GraphSlot]:
        """Re-create, for replay, the pre-hooks that graphs bypass: once per captured slot, when the pre-hooks are on.

        Before they are on (``warmup == 0``: Bridge enables them after the first step) the manual hooks would start a
        parameter all-gather the first step never waits for; Bridge sets them at that point too (``train.py``).
        """
        if not (self.toggles_pre_hooks and hooks.enabled):
            return []
        todo = [s for s in self.slots if s.phase is Phase.CAPTURED and not s.manual_hooks]
        for slot in todo:
            slot.helper.cuda_graph_set_manual_hooks()
            slot.manual_hooks = True
        return todo

    def step_done(self) -> None:
        """Count a training step for every slot whose graphs replayed in it."""
        for slot in self.slots:
            if slot.phase is Phase.CAPTURED:
                slot.graphed_steps += 1

    def teardown(self) -> list[GraphSlot]:
        """Delete every graph; idempotent. A failing delete is logged and does not stop the others."""
        deleted = []
        for slot in self.slots:
            if slot.phase is not Phase.CAPTURED:
                continue
            try:
                if slot.helper.graphs_created():
                    slot.helper.delete_cuda_graphs()
            except Exception as error:
                logger.warning("bridge_cudagraph: deleting the %s graphs failed: %s", slot.submodule, error)
            slot.phase = Phase.DELETED
            slot.manual_hooks = False
            deleted.append(slot)
        return deleted

    def counters(self) -> dict[str, dict[str, int]]:
        """Per-submodule counters (helpers of one submodule summed)."""
        out: dict[str, dict[str, int]] = {}
        for slot in self.slots:
            total = out.setdefault(slot.submodule, {})
            for key, value in slot.counters().items():
                total[key] = total.get(key, 0) + value
        return out


def capture_summary(slots: Sequence[GraphSlot], *, step: int, start_step: int) -> str:
    """The rank-0 block printed after a capture: graphs per submodule, seconds, graph memory, status."""
    lines = [f"bridge_cudagraph: CUDA graph capture before step {step} (loop started at {start_step})"]
    lines.append(f"  {'submodule':<10} {'graphs':>6} {'layers':>6} {'seconds':>8} {'MiB':>9}  status")
    for slot in slots:
        stats = getattr(slot.helper, "stats", None)
        status = slot.phase.value if slot.failure is None else f"{slot.phase.value}, eager: {slot.failure}"
        lines.append(
            f"  {slot.submodule:<10} {int(getattr(stats, 'graphs', 0)):>6} {int(getattr(stats, 'layers', 0)):>6} "
            f"{float(getattr(stats, 'seconds', 0.0)):>8.2f} {getattr(stats, 'graph_memory_bytes', 0) / _MIB:>9.1f}  "
            f"{status}"
        )
        captured = tuple(getattr(stats, "budgets_captured", ()) or ())
        ladder = getattr(getattr(slot.helper, "ladder", None), "budgets", ())
        if stats is not None and captured and ladder:  # captured budgets come from stats
            lines.append(
                f"    {slot.submodule} budgets {list(captured)} of {list(ladder)}: up to {stats.budget_source}; "
                "a larger micro-batch runs eagerly, then gets its budget before the next step"
            )
    return "\n".join(lines)


def _print_rank0(message: str) -> None:
    from megatron.bridge.utils.common_utils import print_rank_0

    print_rank_0(message)


def _helpers_of(provider, model, *, plan):
    return provider.make_graph_helpers(model, plan=plan)


class CudaGraphCallback(Callback):
    """Captures, hooks up, reports and deletes the per-layer graphs of a ``bridge_cudagraph`` provider.

    A no-op for any other model, so it can always be passed. See the module docstring for the event order.

    Args:
        plan: The run's capture plan, built before any process group from the config Bridge will finalize
            (:func:`bridge_cudagraph.bridge.train.run` passes it). Without one it is built at ``on_train_start`` from
            the config Bridge finalized, by the same function (:func:`bridge_cudagraph.plan.from_config.plan_config`,
            ``finalized=True``).
        helper_factory: ``(provider, model, *, plan) -> helpers``; default
            ``provider.make_graph_helpers``. A seam for tests and for callers that build helpers themselves.
        hooks_factory: ``model -> PreHooks``; default :class:`ForwardPreHooks` (Bridge's toggles).
    """

    def __init__(
        self,
        *,
        plan: CapturePlan | None = None,
        helper_factory: Callable[..., Sequence[Any]] | None = None,
        hooks_factory: Callable[[Sequence[Any]], PreHooks] | None = None,
    ) -> None:
        bridge_loop.install_bridge_helper()
        self.plan = plan
        self._helper_factory = helper_factory or _helpers_of
        self._hooks_factory = hooks_factory or ForwardPreHooks
        self.lifecycle: GraphLifecycle | None = None
        self._provider = None
        self._hooks: PreHooks | None = None
        self._step_host: StepHostCaches | None = None  # what step_host.install changed, for uninstall
        self.releases: list[dict[str, Any]] = []
        """One entry per :meth:`release_graphs` call of a run with graphs: ``reason``, ``time``, ``deleted``
        (submodules whose graphs this call freed) and ``process_groups_alive`` (``torch.distributed`` still
        initialised, i.e. the graphs went before the process groups)."""

    # ------------------------------------------------------------------ Bridge events
    def on_train_start(self, context) -> None:
        """Build the helpers and record the start step (the loaded iteration when resuming)."""
        from megatron.core.utils import get_model_config

        from bridge_cudagraph.bridge.providers import is_graph_provider

        # A previous train() in this process (in-process restart) left graphs behind.
        self.release_graphs(reason="on_train_start: graphs of a previous run")
        provider = get_model_config(context.model[0])
        if not is_graph_provider(provider) or not provider.cuda_graph.any_enabled:
            self.lifecycle = None
            return
        if provider.cuda_graph.language.enabled and not bridge_helper_installed():
            raise RuntimeError(
                "bridge_cudagraph's helper was uninstalled from Megatron-Bridge, so Bridge would capture the language "
                "graphs a second time; call bridge_cudagraph.install_bridge_helper() before "
                "pretrain()/finetune()"
            )
        cfg = context.state.cfg
        plan = self.plan
        if plan is None:
            from bridge_cudagraph.plan.from_config import plan_config

            plan = self.plan = plan_config(cfg, world_size=_world_size(), finalized=True)
        helpers = self._helper_factory(provider, context.model, plan=plan)
        from bridge_cudagraph.host import step as step_host

        self._step_host = step_host.install_planned(plan, context.model, context.optimizer)
        warmups = {"language": plan.language.warmup_steps}
        if plan.vision is not None:
            warmups["vision"] = plan.vision.warmup_steps
        slots = []
        for helper in helpers:
            submodule = helper.stats.submodule
            slots.append(GraphSlot(helper, submodule, warmups[submodule]))
        start = context.state.train_state.step
        self.lifecycle = GraphLifecycle(
            slots,
            start_step=start,
            toggles_pre_hooks=_toggles_pre_hooks(cfg),
            on_capture_error=plan.on_capture_error,
        )
        self._provider = provider
        self._hooks = self._hooks_factory(context.model)
        bridge_loop.claim(provider, self)
        when = ", ".join(f"{s.submodule} before step {start + s.warmup}" for s in slots) or "nothing"
        _print_rank0(f"bridge_cudagraph: {plan.num_microbatches} micro-batch(es) per step; will capture {when}")

    def on_train_step_start(self, context) -> None:
        """Capture what is due, then set manual hooks where the pre-hooks are on."""
        lifecycle = self.lifecycle
        if lifecycle is None:
            return
        hooks = cast("PreHooks", self._hooks)  # set with the lifecycle (on_train_start)
        step = context.state.train_state.step
        due = lifecycle.due(step)
        if due:
            _print_rank0(
                f"bridge_cudagraph: capturing {', '.join(s.submodule for s in due)} CUDA graphs before step {step} ..."
            )
            try:
                lifecycle.capture(step, hooks)
            except BaseException:  # on_capture_error="raise": free what exists before Bridge aborts the groups
                self.release_graphs(reason="capture raised")
                raise
            _print_rank0(capture_summary(due, step=step, start_step=lifecycle.start_step))
        for slot, rungs in lifecycle.grow(hooks):
            stats = slot.helper.stats
            _print_rank0(
                f"bridge_cudagraph: before step {step} captured {slot.submodule} budgets {list(rungs)} for larger "
                f"micro-batches; now {list(stats.budgets_captured)}, graph memory "
                f"{stats.graph_memory_bytes / _MIB:.0f} MiB"
                if rungs
                else f"bridge_cudagraph: {slot.submodule} budgets above {list(stats.budgets_captured)} were not "
                "captured (see the warning); such micro-batches run eagerly"
            )
        lifecycle.set_manual_hooks(hooks)

    def on_train_step_end(self, context) -> None:
        """Count graphed steps; report the counters every ``logger.log_interval`` iterations."""
        lifecycle = self.lifecycle
        if lifecycle is None:
            return
        lifecycle.step_done()
        iteration = context.state.train_state.step + 1  # Bridge increments the step after this event
        interval = context.state.cfg.logger.log_interval
        if interval and iteration % interval == 0 and any(s.phase is not Phase.PENDING for s in lifecycle.slots):
            self._report(context.state, iteration, lifecycle.counters())

    def on_train_end(self, context) -> None:
        """Delete every graph (before Bridge destroys its process groups)."""
        self.release_graphs(reason="on_train_end")

    # ------------------------------------------------------------------ owner protocol (bridge_loop)
    def release_graphs(self, reason: str = "Bridge's _delete_cuda_graphs") -> list[GraphSlot]:
        """Delete every graph this callback captured; idempotent; returns the slots this call deleted.

        Reached from Bridge's end-of-loop teardown (via :mod:`~bridge_cudagraph.bridge.loop`, which calls it without
        arguments), ``on_train_end``, and :func:`bridge_cudagraph.host.training_loop.release_graphs_if_training_raises`
        when the loop raises. Never raises for a failing delete (logged by :meth:`GraphLifecycle.teardown`): it runs on
        the way out of a failed run and must not mask that failure.
        """
        if self._step_host is not None:
            from bridge_cudagraph.host import forward as forward_host
            from bridge_cudagraph.host import step as step_host

            forward_counts = forward_host.counts(self._step_host.forward)
            if any(forward_counts.values()):
                _print_rank0(
                    f"bridge_cudagraph: model.cuda_graph.forward: mRoPE positions from the CPU copy in "
                    f"{forward_counts['cpu_positions_calls']} forwards, image tokens merged by rows in "
                    f"{forward_counts['row_merges']}, packed rows handed flat in {forward_counts['flat_batches']}"
                )
            step_host.uninstall(self._step_host)
            self._step_host = None
        lifecycle = self.lifecycle
        if lifecycle is None:
            return []
        deleted = lifecycle.teardown()
        if self._provider is not None:
            bridge_loop.unclaim(self._provider, self)
        self.releases.append(
            {
                "reason": reason,
                "time": time.time(),
                "deleted": [s.submodule for s in deleted],
                "process_groups_alive": _process_groups_alive(),
            }
        )
        if deleted:
            _print_rank0(
                "bridge_cudagraph: deleted the "
                + ", ".join(f"{s.submodule} ({s.graphed_steps} graphed steps)" for s in deleted)
                + f" CUDA graphs ({reason})"
            )
        return deleted

    def _report(self, state, iteration: int, counters: dict[str, dict[str, int]]) -> None:
        parts = [f"{sub}: " + " ".join(f"{k}={v}" for k, v in values.items()) for sub, values in counters.items()]
        _print_rank0(f"bridge_cudagraph [iteration {iteration}] " + " | ".join(parts))
        flat = {f"cuda_graph/{sub}/{k}": v for sub, values in counters.items() for k, v in values.items()}
        writer = state.tensorboard_logger
        if writer is not None:
            for key, value in flat.items():
                writer.add_scalar(key, value, iteration)
        wandb = state.wandb_logger
        if wandb is not None:
            wandb.log(flat, iteration)


def _process_groups_alive() -> bool:
    """Whether ``torch.distributed`` is initialised (Bridge aborts it after a failure, destroys it at the end)."""
    try:
        import torch.distributed as dist

        return bool(dist.is_available() and dist.is_initialized())
    except Exception:  # never let a probe break a teardown
        return False


def _toggles_pre_hooks(cfg) -> bool:
    """Bridge's own rule for runs with DDP forward pre-hooks (``train.py``)."""
    from megatron.bridge.training.train import should_disable_forward_pre_hook

    return should_disable_forward_pre_hook(
        cfg.ddp.use_megatron_fsdp, cfg.optimizer.use_distributed_optimizer, cfg.ddp.overlap_param_gather
    )


def _world_size() -> int:
    """Ranks of the running job (``torch.distributed`` is up at ``on_train_start``)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
