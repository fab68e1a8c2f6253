"""capture.budget_ladder: which rungs are captured, from the sizes the data showed."""

from __future__ import annotations


class TestBudgetLadder:
    def test_the_first_capture_stops_at_the_rung_of_the_largest_size_seen(self):
        from bridge_cudagraph.capture.budget_ladder import BudgetLadder

        ladder = BudgetLadder([4096, 512, 1024, 2048])
        assert ladder.first_rungs() == (512, 1024, 2048, 4096) and "whole ladder" in ladder.source()
        ladder.observe(700)
        ladder.observe(900)
        assert ladder.first_rungs() == (512, 1024) and "(900)" in ladder.source()
        ladder.observe(10_000)  # above every rung: the whole ladder, never a silent cap below the data
        assert ladder.first_rungs() == (512, 1024, 2048, 4096)

    def test_a_wanted_rung_brings_every_rung_up_to_it_once(self):
        from bridge_cudagraph.capture.budget_ladder import BudgetLadder

        ladder = BudgetLadder([512, 1024, 2048, 4096])
        ladder.add((512, 1024))
        assert ladder.top == 1024 and ladder.holds(512) and not ladder.holds(2048) and ladder.pending() == ()
        ladder.want(4096)
        ladder.want(2048)
        assert ladder.pending() == (2048, 4096)
        ladder.add(ladder.pending())
        assert ladder.top == 4096 and ladder.pending() == ()

    def test_a_refused_rung_is_not_asked_for_again(self):
        from bridge_cudagraph.capture.budget_ladder import BudgetLadder

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
