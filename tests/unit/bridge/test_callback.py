"""The graph lifecycle in Bridge's loop, on CPU: fake helpers, fake DDP pre-hooks and a fake loop that calls the
callback's events in the order of Bridge 0.6.2's ``train()`` (line numbers below refer to its ``train.py``).

Bridge's own side of the contract is real: the ``TECudaGraphHelper`` name Bridge looks up is the one
:mod:`bridge_cudagraph.bridge.loop` installs, and the fake loop drives the object it returns exactly as
``train()`` drives its ``cuda_graph_helper``.
"""

from __future__ import annotations

import dataclasses
import gc
import inspect
import logging
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from bridge_cudagraph.bridge import loop as bridge_loop
from bridge_cudagraph.bridge.callback import (
    CudaGraphCallback,
    ForwardPreHooks,
    GraphLifecycle,
    GraphSlot,
    Phase,
    capture_summary,
)
from bridge_cudagraph.config import CachedWalksConfig, CudaGraphConfig, LanguageGraphConfig, VisionGraphConfig
from bridge_cudagraph.examples import tiny
from bridge_cudagraph.host import bridge_helper, compat
from bridge_cudagraph.plan.build import build_plan
from bridge_cudagraph.plan.facts import model_facts


@pytest.fixture(autouse=True)
def _restore_bridge():
    yield
    bridge_helper.uninstall_bridge_helper()


# ---------------------------------------------------------------------------------------------- fakes
@dataclass
class FakeStats:
    submodule: str
    graphs: int = 0
    layers: int = 4
    seconds: float = 0.0
    graph_memory_bytes: int = 0
    replays: int = 0
    eager_fallbacks: int = 0
    failed: str | None = None


class FakeHelper:
    """The TECudaGraphHelper protocol; ``raises`` / ``soft_fail`` / ``empty`` choose how capture goes."""

    def __init__(self, submodule, events, *, raises=None, soft_fail=None, empty=False):
        self.stats = FakeStats(submodule)
        self.events = events
        self.raises, self.soft_fail, self.empty = raises, soft_fail, empty
        self._created = False
        self.manual_hooks = 0

    def create_cudagraphs(self):
        self.events.append(("capture", self.stats.submodule, self.hooks.enabled))
        if self.raises is not None:
            raise self.raises
        if self.soft_fail is not None:
            self.stats.failed = self.soft_fail  # what LanguageGraphHelper does on_capture_error="eager"
            logging.getLogger("bridge_cudagraph").warning("helper warned once: %s", self.soft_fail)
            return
        if not self.empty:
            self._created = True
            self.stats.graphs = 4

    def graphs_created(self):
        return self._created

    def cuda_graph_set_manual_hooks(self):
        assert self._created
        self.manual_hooks += 1
        self.events.append(("manual_hooks", self.stats.submodule))

    def delete_cuda_graphs(self):
        assert self._created, "megatron-core asserts graphs exist before deleting them"
        self._created = False
        self.stats.graphs = 0
        self.events.append(("delete", self.stats.submodule))


class FakePreHooks:
    """DDP forward pre-hooks: disabling twice (or enabling twice) trips Megatron DDP's asserts."""

    def __init__(self, events, enabled=True):
        self.events = events
        self.enabled = enabled

    def disable(self):
        assert self.enabled, "DistributedDataParallel.disable_forward_pre_hook asserts the hooks exist"
        self.enabled = False
        self.events.append(("hooks", "off"))

    def enable(self):
        assert not self.enabled, "DistributedDataParallel.enable_forward_pre_hook asserts none exist"
        self.enabled = True
        self.events.append(("hooks", "on"))


@dataclass
class FakeChunk:
    config: object
    training: bool = True

    def modules(self):
        """No submodules: in particular no vision encoder, so no replica gradient sync is installed."""
        return iter(())


@dataclass
class World:
    """What one fake training run touched."""

    callback: CudaGraphCallback
    context: SimpleNamespace
    hooks: FakePreHooks
    helpers: list
    events: list
    provider: object
    plan: object = None
    factory_calls: list = field(default_factory=list)
    writer: list = field(default_factory=list)


class FakeWriter:
    def __init__(self, sink):
        self.sink = sink

    def add_scalar(self, key, value, step):
        self.sink.append((key, value, step))


def _provider(language=True, vision=True, *, warmup=None, language_warmup=None, vision_warmup=None, **block):
    cg = CudaGraphConfig(
        language=LanguageGraphConfig(enabled=language, warmup_steps=language_warmup),
        vision=VisionGraphConfig(enabled=vision, warmup_steps=vision_warmup),
        **block,
    )
    provider = tiny.tiny_qwen3_vl_provider(cg)
    if warmup is not None:
        provider.cuda_graph_warmup_steps = warmup
    provider.apply_cuda_graph_settings()  # what finalize() does first
    object.__setattr__(provider, "_pg_collection", SimpleNamespace(dp=SimpleNamespace(size=lambda: 2)))
    return provider


def _world(provider, *, helpers_spec=None, overlap=True, gbs=8, mbs=2, log_interval=10):
    events: list = []
    hooks = FakePreHooks(events, enabled=overlap)  # Megatron DDP registers them at construction iff overlapping
    spec = helpers_spec if helpers_spec is not None else [("language", {}), ("vision", {})]
    helpers = [FakeHelper(sub, events, **kw) for sub, kw in spec]
    for h in helpers:
        h.hooks = hooks
    world = World(None, None, hooks, helpers, events, provider)

    def factory(prov, model, *, plan):
        world.factory_calls.append(
            dict(micro_batch_size=plan.micro_batch_size, num_microbatches=plan.num_microbatches)
        )
        assert plan is world.callback.plan  # the run's one plan, handed on, not a re-derived one
        return helpers

    plan = None
    if hasattr(provider, "cuda_graph"):
        # dp 2 (world 2): gbs 8 / (mbs 2 x dp 2) = 2 micro-batches per step.
        plan = build_plan(
            model_facts(provider), provider.cuda_graph, world_size=2, micro_batch_size=mbs, global_batch_size=gbs
        )
    world.plan = plan
    world.callback = CudaGraphCallback(plan=plan, helper_factory=factory, hooks_factory=lambda model: hooks)
    cfg = SimpleNamespace(
        train=SimpleNamespace(global_batch_size=gbs, micro_batch_size=mbs),
        logger=SimpleNamespace(log_interval=log_interval),
        ddp=SimpleNamespace(use_megatron_fsdp=False, overlap_param_gather=overlap),
        optimizer=SimpleNamespace(use_distributed_optimizer=True),
    )
    state = SimpleNamespace(
        cfg=cfg,
        train_state=SimpleNamespace(step=0),
        tensorboard_logger=FakeWriter(world.writer),
        wandb_logger=None,
    )
    world.context = SimpleNamespace(state=state, model=[FakeChunk(provider)], optimizer=object())
    return world


def _bridge_helper(world):
    """What ``train.py:268-280`` builds, through the installed name, with Bridge's own probe for pg_collection."""
    train = compat.bridge_train_module()
    kwargs = dict(model=world.context.model, config=world.provider, seq_length=256, micro_batch_size=2, optimizers=[])
    if "pg_collection" in inspect.signature(train.TECudaGraphHelper.__init__).parameters:
        kwargs["pg_collection"] = object()
    return train.TECudaGraphHelper(**kwargs)


class InjectedFailure(RuntimeError):
    """What a step, a callback or a data loader might raise inside Bridge's loop."""


def run_bridge_loop(
    world, *, start=0, iters=10, eval_interval=None, exit_at=None, skip=(), fail_at=None, sys_exit=False
):
    """Bridge's ``train()`` event order; returns the steps in which each submodule's graphs replayed.

    ``fail_at``: raise :class:`InjectedFailure` after the callbacks' ``on_train_step_end`` of that step (no teardown
    runs: Bridge's loop has no ``try``). ``sys_exit``: end the ``exit_at`` path with ``sys.exit(0)`` as Bridge does
    (``train.py:805``) instead of returning.
    """
    cb, ctx, hooks, provider = world.callback, world.context, world.hooks, world.provider
    toggles = ctx.state.cfg.ddp.overlap_param_gather
    state = ctx.state
    state.train_state.step = start
    helper = _bridge_helper(world)  # train.py:268-280
    cb.on_train_start(ctx)  # train.py:349
    if toggles:  # train.py:364-370: pre-hooks off for the first iteration
        hooks.disable()
    replayed: dict[str, list[int]] = {"language": [], "vision": []}
    warmup = provider.cuda_graph_warmup_steps
    should_exit = False
    while state.train_state.step < iters:
        step = state.train_state.step
        if step in skip:  # train.py:426: a skipped iteration reaches neither the capture block nor the callbacks
            state.train_state.step += 1
            continue
        # train.py:429-441: Bridge's capture block, on the object the installed name returned.
        if not helper.graphs_created() and step - start == warmup:
            helper.create_cudagraphs()
        cb.on_train_step_start(ctx)  # train.py:454
        for h in world.helpers:  # the step: layers replay their graphs only in training mode
            if h.graphs_created() and all(c.training for c in ctx.model):
                replayed[h.stats.submodule].append(step)
        world.events.append(("step", step))
        cb.on_train_step_end(ctx)  # train.py:497
        if fail_at is not None and step == fail_at:
            world.events.append(("raise", step))
            raise InjectedFailure(f"step {step}")
        if step == start:  # train.py:535-564
            if toggles and not hooks.enabled:
                hooks.enable()
                if warmup == 0:
                    assert helper.graphs_created(), "CUDA Graphs should have been created."
                    helper.cuda_graph_set_manual_hooks()
        state.train_state.step += 1
        if eval_interval and state.train_state.step % eval_interval == 0:  # train.py:660-700
            if toggles:
                hooks.disable()
            for chunk in ctx.model:  # eval.py:109
                chunk.training = False
            world.events.append(("eval", state.train_state.step))
            for h in world.helpers:
                if h.graphs_created() and all(c.training for c in ctx.model):
                    replayed[h.stats.submodule].append(-state.train_state.step)
            for chunk in ctx.model:  # eval.py:384
                chunk.training = True
            if toggles:
                hooks.enable()
        if exit_at is not None and state.train_state.step == exit_at:  # checkpoint_and_decide_exit
            should_exit = True
            break
    world.events.append(("bridge_delete",))
    if helper.graphs_created():  # train.py:768 -> 1680
        helper.delete_cuda_graphs()
    if toggles and hooks.enabled:
        hooks.disable()
    if should_exit and sys_exit:
        raise SystemExit(0)  # train.py:805: sys.exit(exit_code) before on_train_end
    if not should_exit:  # train.py:805: sys.exit before on_train_end
        cb.on_train_end(ctx)  # train.py:810
    return replayed


def _index(events, item):
    return events.index(item)


# ---------------------------------------------------------------------------------------------- pure pieces
def test_warmups_come_from_the_plan_resolved_per_submodule():
    """A submodule without its own warmup follows the model's (after finalize(), a set language warmup is the
    model's): one derivation, in the plan."""
    world = _world(_provider(vision_warmup=5))
    assert (world.plan.language.warmup_steps, world.plan.vision.warmup_steps) == (3, 5)
    world = _world(_provider(language_warmup=1))
    assert (world.plan.language.warmup_steps, world.plan.vision.warmup_steps) == (1, 1)
    world.callback.on_train_start(world.context)
    assert [s.warmup for s in world.callback.lifecycle.slots] == [1, 1]


def test_lifecycle_without_pre_hooks_never_toggles_or_sets_manual_hooks():
    events: list = []
    hooks = FakePreHooks(events, enabled=True)
    helper = FakeHelper("language", events)
    helper.hooks = hooks
    life = GraphLifecycle([GraphSlot(helper, "language", 2)], start_step=10, toggles_pre_hooks=False)
    assert life.due(11) == [] and life.capture(11, hooks) == []
    assert [s.submodule for s in life.capture(12, hooks)] == ["language"]
    assert life.set_manual_hooks(hooks) == []
    assert events == [("capture", "language", True)]
    assert life.capture(13, hooks) == []  # once
    assert [s.phase for s in life.teardown()] == [Phase.DELETED] and life.teardown() == []


def test_forward_pre_hooks_probe_reads_megatron_ddp_handles():
    on = SimpleNamespace(remove_forward_pre_hook_handles={"m": object()})
    off = SimpleNamespace(remove_forward_pre_hook_handles={})
    assert ForwardPreHooks([off, on]).enabled
    assert not ForwardPreHooks([off]).enabled
    assert not ForwardPreHooks([object()]).enabled  # FSDP / plain modules: no DDP pre-hooks


# ---------------------------------------------------------------------------------------------- bridge_loop
def test_install_keeps_bridge_probe_and_dispatches_on_the_provider():
    train = compat.bridge_train_module()
    real = train.TECudaGraphHelper
    assert compat.bridge_builds_language_helper_by_name()
    bridge_loop.install_bridge_helper()
    bridge_loop.install_bridge_helper()  # idempotent
    assert bridge_helper.bridge_helper_installed() and issubclass(train.TECudaGraphHelper, real)
    params = inspect.signature(train.TECudaGraphHelper.__init__).parameters
    assert list(params) == list(inspect.signature(real.__init__).parameters)
    assert ("pg_collection" in params) == compat.helper_accepts_pg_collection()
    bridge_helper.uninstall_bridge_helper()
    assert train.TECudaGraphHelper is real and not bridge_helper.bridge_helper_installed()


def test_other_configs_get_the_real_helper_with_the_same_arguments():
    made = []

    class RealHelper:
        def __init__(self, model, config, seq_length, micro_batch_size, optimizers=(), pg_collection=None):
            made.append((model, config, seq_length, micro_batch_size, optimizers, pg_collection))

    dispatch = bridge_loop.dispatching_class(RealHelper)
    assert "pg_collection" in inspect.signature(dispatch.__init__).parameters
    plain = tiny.upstream_provider(tiny.tiny_qwen3_vl_provider())
    helper = dispatch(model=["m"], config=plain, seq_length=8, micro_batch_size=2, optimizers=["o"], pg_collection=1)
    assert type(helper) is RealHelper and made == [(["m"], plain, 8, 2, ["o"], 1)]
    helper = dispatch(["m"], plain, 8, 2)  # positional, as another caller might
    assert type(helper) is RealHelper
    owned = dispatch(model=["m"], config=_provider(), seq_length=8, micro_batch_size=2, pg_collection=1)
    assert isinstance(owned, bridge_loop.CallbackOwnedGraphs) and len(made) == 2


class _Owner:
    """A graph owner as :mod:`bridge_cudagraph.bridge.loop` sees one: ``release_graphs()``, held weakly."""

    released = 0

    def release_graphs(self) -> None:
        self.released += 1


def test_owned_helper_warns_once_when_no_callback_claimed_the_provider(caplog):
    provider = _provider()
    with caplog.at_level(logging.WARNING, logger="bridge_cudagraph"):
        owned = bridge_loop.CallbackOwnedGraphs(provider)  # Bridge builds it before on_train_start: no word yet
        assert "no CudaGraphCallback" not in caplog.text
        assert owned.graphs_created() and owned.graphs_created()  # first asked at the first step
    assert caplog.text.count("no CudaGraphCallback claimed") == 1
    owned.create_cudagraphs()
    owned.cuda_graph_set_manual_hooks()
    owned.delete_cuda_graphs()  # no owner: nothing to do
    caplog.clear()
    claimed = _provider()
    owner = _Owner()
    bridge_loop.claim(claimed, owner)
    with caplog.at_level(logging.WARNING, logger="bridge_cudagraph"):
        owned = bridge_loop.CallbackOwnedGraphs(claimed)
        assert owned.graphs_created()
    assert "no CudaGraphCallback" not in caplog.text
    owned.delete_cuda_graphs()
    assert owner.released == 1


def test_a_claim_lives_on_its_provider_weakly_and_only_its_owner_undoes_it():
    provider, other = _provider(), _provider()
    owner, stranger = _Owner(), _Owner()
    bridge_loop.claim(provider, owner)
    assert bridge_loop.owner_of(provider) is owner and bridge_loop.owner_of(other) is None
    assert all(f.name != bridge_loop._OWNER_ATTRIBUTE for f in dataclasses.fields(provider))  # not in its config
    bridge_loop.unclaim(provider, stranger)
    assert bridge_loop.owner_of(provider) is owner
    bridge_loop.unclaim(provider, owner)
    assert bridge_loop.owner_of(provider) is None
    bridge_loop.unclaim(provider, owner)  # a second undo changes nothing
    bridge_loop.claim(provider, owner)
    del owner
    gc.collect()
    assert bridge_loop.owner_of(provider) is None  # the run holds its owner; the provider does not keep it alive


# ---------------------------------------------------------------------------------------------- the loop
def test_capture_after_warmup_toggles_hooks_once_and_sets_manual_hooks():
    world = _world(_provider())
    replayed = run_bridge_loop(world, iters=10)
    ev = world.events
    # Bridge's own capture block never ran: its helper is the callback-owned stand-in.
    captures = [e for e in ev if e[0] == "capture"]
    assert captures == [("capture", "language", False), ("capture", "vision", False)]
    # warmup 3: three eager steps, then both submodules inside one pre-hook toggle, then manual hooks.
    i = _index(ev, ("capture", "language", False))
    assert ev[i - 1] == ("hooks", "off") and ev[i + 2] == ("hooks", "on")
    assert ev[i + 3 : i + 5] == [("manual_hooks", "language"), ("manual_hooks", "vision")]
    assert ev[i + 5] == ("step", 3) and [e for e in ev[:i] if e[0] == "step"] == [("step", s) for s in range(3)]
    assert replayed == {"language": list(range(3, 10)), "vision": list(range(3, 10))}
    assert all(h.manual_hooks == 1 for h in world.helpers)
    # plugin micro-batch count: 8 / (2 x dp 2), never the global calculator
    assert world.factory_calls == [dict(micro_batch_size=2, num_microbatches=2)]
    # Bridge's end-of-loop teardown (train.py:768) already freed everything; on_train_end is idempotent.
    j = _index(ev, ("bridge_delete",))
    assert ev[j + 1 : j + 3] == [("delete", "language"), ("delete", "vision")]
    assert [e for e in ev if e[0] == "delete"] == [("delete", "language"), ("delete", "vision")]
    assert all(s.phase is Phase.DELETED for s in world.callback.lifecycle.slots)
    assert bridge_loop.owner_of(world.provider) is None


def test_warmup_zero_sets_manual_hooks_after_bridge_enables_the_pre_hooks():
    world = _world(_provider(warmup=0))
    replayed = run_bridge_loop(world, iters=4)
    ev = world.events
    # Bridge disabled the pre-hooks for the first iteration: capture needs no toggle of its own.
    assert ev[:3] == [("hooks", "off"), ("capture", "language", False), ("capture", "vision", False)]
    assert ("manual_hooks", "language") not in ev[: _index(ev, ("step", 0))]
    # After step 0 Bridge enables them and asserts graphs_created() on its (stand-in) helper: both hold.
    k = _index(ev, ("hooks", "on"))
    assert ev[k + 1 : k + 3] == [("manual_hooks", "language"), ("manual_hooks", "vision")]
    assert ev[k + 3] == ("step", 1)
    assert replayed["language"] == [0, 1, 2, 3]


def test_resume_captures_warmup_steps_after_the_loaded_iteration():
    world = _world(_provider())
    replayed = run_bridge_loop(world, start=30, iters=40)
    first = [e for e in world.events if e[0] in ("capture", "step")][:5]
    steps = [("step", 30), ("step", 31), ("step", 32)]
    assert first == [*steps, ("capture", "language", False), ("capture", "vision", False)]
    assert replayed["language"] == list(range(33, 40))
    assert world.callback.lifecycle.start_step == 30


def test_language_and_vision_warmups_differ():
    world = _world(_provider(vision_warmup=5))
    replayed = run_bridge_loop(world, iters=8)
    assert replayed == {"language": list(range(3, 8)), "vision": list(range(5, 8))}
    ev = world.events
    assert ev[_index(ev, ("capture", "vision", False)) - 1] == ("hooks", "off")  # its own toggle at step 5
    assert sum(1 for e in ev if e == ("hooks", "off")) == 4  # first step, two captures, end of loop


def test_evaluation_runs_eagerly_and_training_replays_afterwards():
    world = _world(_provider())
    replayed = run_bridge_loop(world, iters=12, eval_interval=5)
    assert [e for e in world.events if e[0] == "eval"] == [("eval", 5), ("eval", 10)]
    assert all(s >= 0 for s in replayed["language"])  # nothing replayed while in eval mode
    assert replayed["language"] == list(range(3, 12))  # and the graphs survive evaluation
    assert [e for e in world.events if e[0] == "capture"] == [
        ("capture", "language", False),
        ("capture", "vision", False),
    ]


def test_a_skipped_iteration_does_not_lose_the_capture():
    world = _world(_provider())
    replayed = run_bridge_loop(world, iters=8, skip={3})
    assert replayed["language"] == list(range(4, 8))


def test_a_raising_capture_trains_on_eagerly_with_one_warning(caplog):
    world = _world(_provider(), helpers_spec=[("language", dict(raises=RuntimeError("boom\nmore"))), ("vision", {})])
    with caplog.at_level(logging.WARNING, logger="bridge_cudagraph"):
        replayed = run_bridge_loop(world, iters=6)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "language capture failed" in warnings[0].getMessage()
    language = world.callback.lifecycle.slots[0]
    assert language.phase is Phase.FAILED and language.failure == "RuntimeError: boom"
    assert replayed == {"language": [], "vision": [3, 4, 5]}
    ev = world.events
    i = _index(ev, ("capture", "language", False))
    assert ev[i - 1] == ("hooks", "off") and ev[i + 2] == ("hooks", "on")  # re-enabled despite the error
    assert ("manual_hooks", "language") not in ev and ("delete", "language") not in ev
    assert "failed, eager: RuntimeError: boom" in capture_summary(world.callback.lifecycle.slots, step=3, start_step=0)


def test_a_helper_that_falls_back_itself_is_not_warned_twice(caplog):
    world = _world(_provider(), helpers_spec=[("language", dict(soft_fail="TypeError: x")), ("vision", {})])
    with caplog.at_level(logging.WARNING, logger="bridge_cudagraph"):
        run_bridge_loop(world, iters=5)
    assert [r.getMessage() for r in caplog.records] == ["helper warned once: TypeError: x"]
    assert world.callback.lifecycle.slots[0].phase is Phase.FAILED
    assert world.callback.lifecycle.slots[0].failure == "TypeError: x"


def test_nothing_to_graph_on_this_rank_is_not_a_failure():
    world = _world(_provider(), helpers_spec=[("language", dict(empty=True))])
    replayed = run_bridge_loop(world, iters=5)
    assert world.callback.lifecycle.slots[0].phase is Phase.EMPTY and replayed["language"] == []


def test_on_capture_error_raise_reenables_hooks_and_frees_what_was_captured():
    provider = _provider(on_capture_error="raise")
    world = _world(provider, helpers_spec=[("vision", {}), ("language", dict(raises=ValueError("bad")))])
    with pytest.raises(ValueError, match="bad"):
        run_bridge_loop(world, iters=6)
    assert world.hooks.enabled
    assert ("delete", "vision") in world.events
    assert bridge_loop.owner_of(provider) is None


def test_early_exit_frees_graphs_through_bridges_teardown():
    world = _world(_provider())
    run_bridge_loop(world, iters=20, exit_at=6)  # exit_interval: sys.exit, no on_train_end
    ev = world.events
    j = _index(ev, ("bridge_delete",))
    assert ev[j + 1 : j + 3] == [("delete", "language"), ("delete", "vision")]


def test_a_second_train_in_the_same_process_starts_over():
    world = _world(_provider())
    callback, ctx = world.callback, world.context
    ctx.state.train_state.step = 0
    callback.on_train_start(ctx)
    world.hooks.enabled = True
    for step in range(5):
        ctx.state.train_state.step = step
        callback.on_train_step_start(ctx)
    assert all(h.graphs_created() for h in world.helpers)
    ctx.state.train_state.step = 5  # e.g. an in-process restart from a checkpoint at 5
    callback.on_train_start(ctx)
    assert not any(h.graphs_created() for h in world.helpers)
    assert callback.lifecycle.start_step == 5 and all(s.phase is Phase.PENDING for s in callback.lifecycle.slots)


def test_counters_go_to_the_log_and_tensorboard_every_log_interval(capsys):
    world = _world(_provider(), log_interval=4)
    run_bridge_loop(world, iters=9)
    out = capsys.readouterr().out
    assert "bridge_cudagraph [iteration 4] language: graphs=4 graphed_steps=1" in out
    assert "bridge_cudagraph [iteration 8] language: graphs=4 graphed_steps=5" in out
    assert ("cuda_graph/vision/graphed_steps", 5, 8) in world.writer
    assert "capture before step 3" in out and "deleted the language (6 graphed steps)" in out


@pytest.mark.parametrize("language, vision", [(False, False), (True, False)])
def test_only_enabled_submodules_or_nothing(language, vision):
    spec = [("language", {})] if language else []
    world = _world(_provider(language=language, vision=vision), helpers_spec=spec)
    replayed = run_bridge_loop(world, iters=5)
    if not language:
        assert world.callback.lifecycle is None and world.factory_calls == []
    else:
        assert replayed["language"] == [3, 4]


def test_plain_bridge_provider_is_left_alone():
    plain = tiny.upstream_provider(tiny.tiny_qwen3_vl_provider())
    world = _world(plain)
    world.callback.on_train_start(world.context)
    assert world.callback.lifecycle is None and world.factory_calls == []


def test_no_pre_hooks_without_overlap_param_gather():
    world = _world(_provider(), overlap=False)
    replayed = run_bridge_loop(world, iters=5)
    assert not [e for e in world.events if e[0] in ("hooks", "manual_hooks")]
    assert replayed["language"] == [3, 4]


def test_refuses_to_run_when_bridge_would_capture_too():
    world = _world(_provider())
    bridge_helper.uninstall_bridge_helper()
    with pytest.raises(RuntimeError, match="second time"):
        world.callback.on_train_start(world.context)


# ---------------------------------------------------------------------------------------------- endings
class FakePretrainModule:
    """Bridge's ``pretrain`` module around the fake loop: ``_pretrain`` calls the loop by its module-level name
    ``train`` and, when it raises, aborts the process groups before re-raising (``pretrain.py:200-211``); after a
    normal end it destroys them (``pretrain.py:215``)."""

    def __init__(self, world, monkeypatch):
        self.world = world
        self.alive = True
        self.train = run_bridge_loop
        import bridge_cudagraph.bridge.callback as callback_module

        monkeypatch.setattr(callback_module, "_process_groups_alive", lambda: self.alive)

    def _pretrain(self, **loop):
        try:
            self.train(self.world, **loop)
        except BaseException:
            self.world.events.append(("abort_process_groups",))
            self.alive = False
            raise
        self.world.events.append(("destroy_process_groups",))
        self.alive = False


def _deleted_before(events, marker):
    end = _index(events, marker)
    return [e[1] for e in events[:end] if e[0] == "delete"]


def test_an_exception_in_the_loop_frees_the_graphs_before_bridge_aborts_the_groups(monkeypatch):
    from bridge_cudagraph.host.training_loop import release_graphs_if_training_raises

    world = _world(_provider())
    bridge = FakePretrainModule(world, monkeypatch)
    with pytest.raises(InjectedFailure, match="step 6"):  # never swallowed
        with release_graphs_if_training_raises(world.callback, bridge):
            bridge._pretrain(iters=10, fail_at=6)
    assert bridge.train is run_bridge_loop  # the loop's name is restored
    ev = world.events
    assert _deleted_before(ev, ("abort_process_groups",)) == ["language", "vision"]
    assert _index(ev, ("raise", 6)) < _index(ev, ("delete", "language"))
    assert ("bridge_delete",) not in ev  # Bridge's own teardown never ran on this path
    assert all(s.phase is Phase.DELETED for s in world.callback.lifecycle.slots)
    (release,) = world.callback.releases
    assert release["reason"] == "training loop raised InjectedFailure"
    assert release["deleted"] == ["language", "vision"] and release["process_groups_alive"]


def test_without_the_wrapper_the_groups_are_aborted_with_graphs_alive(monkeypatch):
    """Why run() wraps the loop: no Bridge event fires between the raise and the abort."""
    world = _world(_provider())
    bridge = FakePretrainModule(world, monkeypatch)
    with pytest.raises(InjectedFailure):
        bridge._pretrain(iters=10, fail_at=6)
    assert _deleted_before(world.events, ("abort_process_groups",)) == []
    assert all(h.graphs_created() for h in world.helpers)


def test_sigterm_exit_frees_the_graphs_in_bridges_teardown_then_exits_zero(monkeypatch):
    """train.exit_signal_handler: the loop leaves through _delete_cuda_graphs and sys.exit(0) (no on_train_end)."""
    from bridge_cudagraph.host.training_loop import release_graphs_if_training_raises

    world = _world(_provider())
    bridge = FakePretrainModule(world, monkeypatch)
    with pytest.raises(SystemExit) as exited:
        with release_graphs_if_training_raises(world.callback, bridge):
            bridge._pretrain(iters=10, exit_at=6, sys_exit=True)
    assert exited.value.code == 0
    ev = world.events
    j = _index(ev, ("bridge_delete",))
    assert ev[j + 1 : j + 3] == [("delete", "language"), ("delete", "vision")]
    assert _deleted_before(ev, ("abort_process_groups",)) == ["language", "vision"]
    first, then = world.callback.releases
    assert first == {**first, "reason": "Bridge's _delete_cuda_graphs", "deleted": ["language", "vision"]}
    assert first["process_groups_alive"]
    assert then["reason"] == "training loop raised SystemExit" and then["deleted"] == []


def test_a_normal_end_frees_the_graphs_before_the_groups_are_destroyed(monkeypatch):
    from bridge_cudagraph.host.training_loop import release_graphs_if_training_raises

    world = _world(_provider())
    bridge = FakePretrainModule(world, monkeypatch)
    with release_graphs_if_training_raises(world.callback, bridge):
        bridge._pretrain(iters=10)
    assert _deleted_before(world.events, ("destroy_process_groups",)) == ["language", "vision"]
    reasons = [(r["reason"], r["deleted"], r["process_groups_alive"]) for r in world.callback.releases]
    assert reasons == [
        ("Bridge's _delete_cuda_graphs", ["language", "vision"], True),
        ("on_train_end", [], True),
    ]


def test_releases_are_logged_only_for_runs_with_graphs():
    world = _world(_provider(language=False, vision=False), helpers_spec=[])
    run_bridge_loop(world, iters=4)
    assert world.callback.releases == [] and world.callback.release_graphs() == []


def test_process_groups_alive_follows_torch_distributed(tmp_path, monkeypatch):
    import torch.distributed as dist

    from bridge_cudagraph.bridge.callback import _process_groups_alive

    assert not _process_groups_alive()
    if Path("/sys/class/net/lo").exists():  # gloo picks an interface from the host name; loopback always works
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        assert _process_groups_alive()
    finally:
        dist.destroy_process_group()
    assert not _process_groups_alive()


def test_the_cached_walks_go_on_at_train_start_and_off_with_the_graphs():
    """The callback puts the optimizer's walks done once (``bridge_cudagraph.host.optimizer``) on the run's real
    optimizer classes and the finalisation's (``bridge_cudagraph.host.finalize``) on its config when the plan says so
    (the default where graphs are), and takes them off when it releases the graphs; ``cached_walks.optimizer: false``
    leaves the optimizer alone, ``cached_walks.grad_finalize: false`` the finalisation function, each without the
    other. The instances are bare (their ``__init__`` needs a GPU); the classes are megatron-core's and Transformer
    Engine's."""
    import torch  # noqa: F401  (first: Transformer Engine finds NCCL through torch's libraries)
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    from transformer_engine.pytorch.optimizers import FusedAdam

    from bridge_cudagraph.host import finalize as finalize_host
    from bridge_cudagraph.host import optimizer as optimizer_host

    def finalize(*args, **kwargs):  # stands in for Bridge's partial(finalize_model_grads, ...)
        return None

    for optimizer_walks, finalize_walk in ((None, None), (False, None), (None, False), (False, False)):
        walks = CachedWalksConfig(optimizer=optimizer_walks, grad_finalize=finalize_walk)
        provider = _provider(cached_walks=walks)
        provider.finalize_model_grads_func = finalize
        world = _world(provider)
        optimizer = object.__new__(DistributedOptimizer)
        optimizer.optimizer = object.__new__(FusedAdam)
        world.context.optimizer = optimizer
        world.callback.on_train_start(world.context)
        assert world.plan.cached_walks.optimizer is (optimizer_walks is None)
        assert world.plan.cached_walks.grad_finalize is (finalize_walk is None)
        assert optimizer_host.installed(optimizer) is (optimizer_walks is None), walks
        assert finalize_host.installed(provider) is (finalize_walk is None), walks
        assert (provider.finalize_model_grads_func is finalize) is (finalize_walk is not None)
        world.callback.release_graphs(reason="test")
        assert type(optimizer) is DistributedOptimizer and type(optimizer.optimizer) is FusedAdam
        assert provider.finalize_model_grads_func is finalize


class FakeLadderHelper(FakeHelper):
    """A budgeted helper (packed language, vision): rungs a micro-batch above the captured top asked for wait in
    ``pending`` until the lifecycle captures them before a step."""

    def __init__(self, submodule, events, pending=()):
        super().__init__(submodule, events)
        self.stats.budgets_captured = (512, 1024)
        self.pending = tuple(pending)

    def pending_budgets(self):
        return self.pending

    def capture_pending(self):
        self.events.append(("grow", self.stats.submodule, self.hooks.enabled, self.pending))
        grown, self.pending = self.pending, ()
        self.stats.budgets_captured = (*self.stats.budgets_captured, *grown)
        return grown


def test_growing_a_ladder_captures_pending_rungs_with_the_pre_hooks_off_and_only_when_asked():
    events = []
    hooks = FakePreHooks(events)
    ladder = FakeLadderHelper("language", events, pending=(2048, 4096))
    plain = FakeHelper("vision", events)
    for helper in (ladder, plain):
        helper.hooks = hooks
    slots = [GraphSlot(ladder, "language", 0), GraphSlot(plain, "vision", 0)]
    lifecycle = GraphLifecycle(slots, start_step=0, toggles_pre_hooks=True)
    assert lifecycle.grow(hooks) == []  # nothing captured yet: a pending ladder waits for its first capture
    lifecycle.capture(0, hooks)
    events.clear()
    grown = lifecycle.grow(hooks)
    assert grown == [(slots[0], (2048, 4096))]
    assert events == [("hooks", "off"), ("grow", "language", False, (2048, 4096)), ("hooks", "on")]
    assert ladder.stats.budgets_captured == (512, 1024, 2048, 4096)
    events.clear()
    assert lifecycle.grow(hooks) == [] and events == []  # nothing pending: the pre-hooks are left alone


def test_the_capture_summary_names_the_captured_rungs_and_why():
    events = []
    helper = FakeLadderHelper("language", events)
    helper.ladder = SimpleNamespace(budgets=(512, 1024, 2048))
    helper.stats.budget_source = "the largest micro-batch before capture (900)"
    text = capture_summary([GraphSlot(helper, "language", 3, phase=Phase.CAPTURED)], step=3, start_step=0)
    assert "language budgets [512, 1024] of [512, 1024, 2048]: up to the largest micro-batch before capture (900)" in (
        text
    )
