"""capture.ladder_helper: a ladder's first capture, its growth between steps and the hooks a re-capture sets again."""

from __future__ import annotations

import torch


class _GraphSet:
    """A stand-in for one copy's graph set of one rung: what the ladder counts (its ``layers``)."""

    def __init__(self, budget, copy):
        self.budget, self.copy, self.layers = budget, copy, [object(), object()]


class _Ladder:
    """A budgeted helper reduced to what :class:`LadderHelper` reads: its capture records rungs, its delete forgets
    them (the GPU tests run the real helpers)."""

    def __new__(cls, budgets, captured, per_unit):
        from bridge_cudagraph.capture.budget_ladder import BudgetLadder
        from bridge_cudagraph.capture.graph_copies import GraphCopies
        from bridge_cudagraph.capture.ladder_helper import LadderHelper
        from bridge_cudagraph.capture.stats import CaptureStats

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
    import bridge_cudagraph.capture.ladder_helper as ladder_helper

    monkeypatch.setattr(ladder_helper, "free_for_capture", lambda: 10_000)
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
    import bridge_cudagraph.capture.ladder_helper as ladder_helper

    monkeypatch.setattr(ladder_helper, "free_for_capture", lambda: 100)
    helper = _Ladder([512, 1024, 2048, 4096], (512, 1024), per_unit=1)
    helper.ladder.want(4096)  # needs 1.2 x 4096 with 1024 of it the pool it replaces: more than 100 + 1024
    helper.events.clear()
    assert helper.capture_pending() == ()
    assert helper.events == [] and helper.ladder.captured == (512, 1024)
    assert "go on running eagerly" in caplog.text
    helper.ladder.want(4096)
    assert helper.pending_budgets() == ()  # refused once, not asked for again


def test_a_ladder_helpers_first_capture_takes_the_rungs_up_to_the_data_into_one_pool_per_copy(
    monkeypatch, fake_allocator
):
    """:class:`LadderHelper`'s own capture path (the packed language and vision helpers take it): pools made once per
    copy, the rungs up to the largest micro-batch seen, each rung's set for each copy, the stats and the ladder."""
    from bridge_cudagraph.capture.budget_ladder import BudgetLadder
    from bridge_cudagraph.capture.graph_copies import GraphCopies
    from bridge_cudagraph.capture.ladder_helper import LadderHelper
    from bridge_cudagraph.capture.stats import CaptureStats

    state = fake_allocator
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
            return _GraphSet(budget, copy)

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
