"""capture.ladder_capture: every capture keeps TE's clone of the parameter gradients; the rungs of each copy share
its pool, captured largest first and measured one by one; a failed capture's outcome."""

from __future__ import annotations

import pytest
import torch

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


def test_the_tested_te_shares_ladder_buffers():
    """TE 2.20.2 has the ``_order`` path that gives a rung's outputs and consumed gradients back to the pool."""
    from bridge_cudagraph.capture.ladder_capture import ladder_order_kwargs
    from bridge_cudagraph.host.compat import te_graphs_share_ladder_buffers

    assert te_graphs_share_ladder_buffers()
    assert ladder_order_kwargs(4) == {
        "_order": [1, -1],
        "_num_layers_per_chunk": [4],
        "_reuse_graph_input_output_buffers": True,
    }


class _GraphSet:
    """A stand-in for one copy's graph set of one rung: what the ladder counts (its ``layers``)."""

    def __init__(self, budget, copy):
        self.budget, self.copy, self.layers = budget, copy, [object(), object()]


def test_the_ladder_captures_each_copy_largest_first_and_measures_each_rung(fake_allocator):
    from bridge_cudagraph.capture.ladder_capture import capture_budget_ladder
    from bridge_cudagraph.capture.stats import CaptureStats

    state = fake_allocator
    calls = []

    def capture_one(budget, copy, pool):
        calls.append((budget, copy, pool))
        state["reserved"] += budget
        state["allocated"] += 1
        return _GraphSet(budget, copy)

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


@pytest.mark.usefixtures("fake_allocator")
def test_a_later_capture_that_fails_keeps_the_graphs_and_a_first_one_leaves_the_model_eager():
    from bridge_cudagraph.capture.ladder_capture import capture_budget_ladder
    from bridge_cudagraph.capture.stats import CaptureStats

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
