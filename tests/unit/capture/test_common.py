"""capture.common: every capture keeps TE's clone of the parameter gradients; the budget ladder's capture order."""

from __future__ import annotations

import pytest
import torch

from bridge_cudagraph.capture.param_grads import ddp_consumes_param_grads
from bridge_cudagraph.host.compat import te_graphs_clone_param_grads


def test_the_tested_te_clones_returned_param_grads_by_default():
    """TE 2.20.2 (TESTED_STACK) has ``clone_param_grads_on_return``, default True, the setting every capture keeps; the
    probe and the default are read from the real signature."""
    import inspect

    from transformer_engine.pytorch import make_graphed_callables

    assert te_graphs_clone_param_grads()
    assert inspect.signature(make_graphed_callables).parameters["clone_param_grads_on_return"].default is True


def test_no_capture_asks_te_to_hand_back_its_own_gradient_buffers():
    """Nothing in the package passes ``clone_param_grads_on_return``: DDP's hook, the only other reader, runs on its
    own stream, unordered with the next replays that reuse the buffers (run 83: four layers' gradients corrupted)."""
    from pathlib import Path

    import bridge_cudagraph

    root = Path(bridge_cudagraph.__file__).parent
    passing = [p for p in root.rglob("*.py") if "clone_param_grads_on_return=" in p.read_text()]
    passing += [p for p in root.rglob("*.py") if '"clone_param_grads_on_return":' in p.read_text()]
    assert passing == []


def test_parameters_outside_megatron_ddp_are_not_summed_by_graphs():
    layer = torch.nn.Linear(4, 4)
    assert not ddp_consumes_param_grads([layer], [layer])


def test_frozen_parameters_need_no_owner_but_trainable_ones_do():
    frozen = torch.nn.Linear(4, 4).requires_grad_(False)
    # No chunk at all: every trainable parameter (none here) is owned.
    assert ddp_consumes_param_grads([], [frozen])
    assert not ddp_consumes_param_grads([], [torch.nn.Linear(4, 4)])


def test_the_tested_te_shares_ladder_buffers():
    """TE 2.20.2 has the ``_order`` path that gives a rung's outputs and consumed gradients back to the pool."""
    from bridge_cudagraph.capture.common import ladder_order_kwargs
    from bridge_cudagraph.host.compat import te_graphs_share_ladder_buffers

    assert te_graphs_share_ladder_buffers()
    assert ladder_order_kwargs(4) == {
        "_order": [1, -1],
        "_num_layers_per_chunk": [4],
        "_reuse_graph_input_output_buffers": True,
    }


class TestBudgetLadder:
    def test_the_first_capture_stops_at_the_rung_of_the_largest_size_seen(self):
        from bridge_cudagraph.capture.common import BudgetLadder

        ladder = BudgetLadder([4096, 512, 1024, 2048])
        assert ladder.first_rungs() == (512, 1024, 2048, 4096) and "whole ladder" in ladder.source()
        ladder.observe(700)
        ladder.observe(900)
        assert ladder.first_rungs() == (512, 1024) and "(900)" in ladder.source()
        ladder.observe(10_000)  # above every rung: the whole ladder, never a silent cap below the data
        assert ladder.first_rungs() == (512, 1024, 2048, 4096)

    def test_a_wanted_rung_brings_every_rung_up_to_it_once(self):
        from bridge_cudagraph.capture.common import BudgetLadder

        ladder = BudgetLadder([512, 1024, 2048, 4096])
        ladder.add((512, 1024))
        assert ladder.top == 1024 and ladder.holds(512) and not ladder.holds(2048) and ladder.pending() == ()
        ladder.want(4096)
        ladder.want(2048)
        assert ladder.pending() == (2048, 4096)
        ladder.add(ladder.pending())
        assert ladder.top == 4096 and ladder.pending() == ()

    def test_a_refused_rung_is_not_asked_for_again(self):
        from bridge_cudagraph.capture.common import BudgetLadder

        ladder = BudgetLadder([512, 1024, 2048])
        ladder.add((512,))
        ladder.want(1024)
        ladder.refuse()
        ladder.want(1024)
        assert ladder.pending() == ()
        ladder.want(2048)  # a larger one still may be
        assert ladder.pending() == (1024, 2048)
        ladder.reset()
        assert ladder.captured == () and ladder.pending() == ()


def test_static_buffers_give_each_rung_a_view_of_one_buffer():
    """Rungs of one copy share their static inputs: views of the first rows of the largest rung's buffer, leaves
    that take a gradient of their own; a larger rung later gets a new buffer and the old views keep theirs."""
    from bridge_cudagraph.capture.common import StaticBuffers

    statics = StaticBuffers(device="cpu")
    top = statics.view("h", (8, 1, 4), torch.float32, requires_grad=True)
    small = statics.view("h", (4, 1, 4), torch.float32, requires_grad=True)
    assert small.data_ptr() == top.data_ptr() and small.is_leaf and small.requires_grad
    (small * 2).sum().backward()
    assert small.grad.shape == (4, 1, 4) and top.grad is None
    assert statics.nbytes() == 8 * 4 * 4
    larger = statics.view("h", (16, 1, 4), torch.float32)
    assert larger.data_ptr() != top.data_ptr() and top.shape == (8, 1, 4)
    statics.clear()
    assert statics.nbytes() == 0


class _Set:
    def __init__(self, budget, copy):
        self.budget, self.copy, self.layers = budget, copy, [object(), object()]


def _fake_device(monkeypatch, grow_by):
    """The allocator calls the ladder makes, on a machine without CUDA: reserved memory grows by ``grow_by(budget)``
    at each capture (a measurement stand-in; the GPU tests measure the real pools)."""
    state = {"reserved": 0, "allocated": 0}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a, **k: state["reserved"])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a, **k: state["allocated"])
    return state


def test_the_ladder_captures_each_copy_largest_first_and_measures_each_rung(monkeypatch):
    from bridge_cudagraph.capture.common import CaptureStats, capture_budget_ladder

    state = _fake_device(monkeypatch, None)
    calls = []

    def capture_one(budget, copy, pool):
        calls.append((budget, copy, pool))
        state["reserved"] += budget
        state["allocated"] += 1
        return _Set(budget, copy)

    stats = CaptureStats("language")
    layer = torch.nn.Linear(2, 2).requires_grad_(False)
    graphs, fused = capture_budget_ladder(
        stats=stats,
        model_chunks=[],
        layers=[layer],
        budgets=(512, 2048, 1024),
        pools=["p0", "p1"],
        capture_one=capture_one,
        on_capture_error="raise",
        submodule="language",
    )
    assert calls == [
        (2048, 0, "p0"),
        (2048, 1, "p1"),
        (1024, 0, "p0"),
        (1024, 1, "p1"),
        (512, 0, "p0"),
        (512, 1, "p1"),
    ]
    assert stats.param_grads_cloned is True  # TE's default, kept: nothing summed them (no DDP chunk here)
    assert sorted(graphs) == [512, 1024, 2048] and [s.copy for s in graphs[1024]] == [0, 1]
    assert stats.per_budget == {2048: 4096, 1024: 2048, 512: 1024} and stats.per_budget_live == {
        2048: 2,
        1024: 2,
        512: 2,
    }
    assert stats.graphs == 3 * 2 * 2 and fused == [] and stats.failed is None
    assert stats.graph_memory_bytes == 4096 + 2048 + 1024


def test_a_later_capture_that_fails_keeps_the_graphs_and_a_first_one_leaves_the_model_eager(monkeypatch):
    from bridge_cudagraph.capture.common import CaptureStats, capture_budget_ladder

    _fake_device(monkeypatch, None)

    def broken(budget, copy, pool):
        raise RuntimeError("out of memory")

    stats = CaptureStats("vision", graphs=8)
    layer = torch.nn.Linear(2, 2).requires_grad_(False)
    kwargs = dict(model_chunks=[], budgets=(4096,), pools=["p"], capture_one=broken, submodule="vision")
    assert capture_budget_ladder(stats=stats, layers=[layer], on_capture_error="eager", first=False, **kwargs) == (
        {},
        [],
    )
    assert stats.failed is None and stats.graphs == 8  # the rungs captured before stay
    first = CaptureStats("vision")
    assert capture_budget_ladder(stats=first, layers=[layer], on_capture_error="eager", **kwargs) == (
        {},
        [],
    )
    assert "out of memory" in first.failed
    with pytest.raises(RuntimeError, match="out of memory"):
        capture_budget_ladder(stats=first, layers=[layer], on_capture_error="raise", **kwargs)


class _Ladder:
    """A budgeted helper reduced to what :class:`LadderHelper` reads: its capture records rungs, its delete forgets
    them (the GPU tests run the real helpers)."""

    def __new__(cls, budgets, captured, per_unit):
        from bridge_cudagraph.capture.common import BudgetLadder, CaptureStats, GraphCopies, LadderHelper

        class Helper(LadderHelper):
            def __init__(self):
                self.ladder = BudgetLadder(budgets)
                self.stats = CaptureStats("language")
                self.copies = GraphCopies(1)
                self.graphs = {}
                self._manual_hooks = False
                self.events = []
                self._capture(captured, first=True)

            def _capture(self, rungs, *, first):
                self.events.append(("capture", tuple(rungs), first))
                self.graphs = {b: [object()] for b in rungs}
                self.stats.per_budget = {b: (per_unit * b if b == max(rungs) else 0) for b in rungs}
                self.ladder.add(rungs)
                self.stats.budgets_captured = self.ladder.captured
                return True

            def delete_cuda_graphs(self):
                self.events.append(("delete",))
                self.graphs = {}
                self.ladder.reset()

            def _set_manual_hooks(self):
                self.events.append(("hooks",))

        return Helper()


def test_growing_recaptures_the_ladder_up_to_the_new_top_and_sets_the_hooks_again(monkeypatch):
    import bridge_cudagraph.capture.common as common

    monkeypatch.setattr(common, "free_for_capture", lambda: 10_000)
    helper = _Ladder([512, 1024, 2048, 4096], (512, 1024), per_unit=1)
    helper.cuda_graph_set_manual_hooks()
    assert helper.capture_pending() == ()  # nothing asked for
    helper.ladder.want(4096)
    helper.events.clear()
    assert helper.capture_pending() == (2048, 4096)
    assert helper.events == [("delete",), ("capture", (512, 1024, 2048, 4096), True), ("hooks",)]
    assert helper.stats.late_captures == 2 and helper.pending_budgets() == ()
    assert "then a larger one in training (4096)" in helper.stats.budget_source


def test_growing_that_does_not_fit_is_refused_once_and_keeps_the_graphs(monkeypatch, caplog):
    import bridge_cudagraph.capture.common as common

    monkeypatch.setattr(common, "free_for_capture", lambda: 100)
    helper = _Ladder([512, 1024, 2048, 4096], (512, 1024), per_unit=1)
    helper.ladder.want(4096)  # needs 1.2 x 4096 with 1024 of it the pool it replaces: more than 100 + 1024
    helper.events.clear()
    assert helper.capture_pending() == ()
    assert helper.events == [] and helper.ladder.captured == (512, 1024)
    assert "go on running eagerly" in caplog.text
    helper.ladder.want(4096)
    assert helper.pending_budgets() == ()  # refused once, not asked for again


def test_a_ladder_helpers_first_capture_takes_the_rungs_up_to_the_data_into_one_pool_per_copy(monkeypatch):
    """:class:`LadderHelper`'s own capture path (the packed language and vision helpers take it): pools made once per
    copy, the rungs up to the largest micro-batch seen, each rung's set for each copy, the stats and the ladder."""
    from bridge_cudagraph.capture.common import BudgetLadder, CaptureStats, GraphCopies, LadderHelper

    state = _fake_device(monkeypatch, None)
    pools = iter(["pool0", "pool1"])
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: next(pools))
    layer = torch.nn.Linear(2, 2).requires_grad_(False)

    class Helper(LadderHelper):
        def __init__(self):
            self.model, self.on_capture_error = [], "raise"
            self.ladder, self.stats, self.copies = (
                BudgetLadder([256, 512, 1024, 2048]),
                CaptureStats("vision"),
                (GraphCopies(2)),
            )
            self.graphs, self._pools, self._fused_grad_params, self._manual_hooks = {}, [], [], False
            self.rungs = []

        def _captured_layers(self):
            return [layer]

        def _capture_rung(self, budget, copy, pool):
            self.rungs.append((budget, copy, pool))
            state["reserved"] += budget
            return _Set(budget, copy)

    helper = Helper()
    helper.ladder.observe(600)
    helper.create_cudagraphs()
    assert helper.rungs == [
        (1024, 0, "pool0"),
        (1024, 1, "pool1"),
        (512, 0, "pool0"),
        (512, 1, "pool1"),
        (256, 0, "pool0"),
        (256, 1, "pool1"),
    ]
    assert helper.graphs_created() and sorted(helper.graphs) == [256, 512, 1024]
    assert helper.stats.budgets_captured == (256, 512, 1024) and "(600)" in helper.stats.budget_source
    assert helper.stats.graphs == 3 * 2 * 2 and helper.ladder.top == 1024
    helper.create_cudagraphs()  # a second call captures nothing more
    assert len(helper.rungs) == 6
