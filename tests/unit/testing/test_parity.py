"""The parity helpers cannot be fooled: a NaN or inf on either side fails, a missing step fails, a real
difference is reported, a gradient on one side only is a mismatch (and none on either side is reported), and a
capture that fell back to eager is not "captured"."""

from __future__ import annotations

import math

import pytest
import torch

from bridge_cudagraph.capture.stats import CaptureStats
from bridge_cudagraph.testing.parity import (
    assert_captured,
    capture_problems,
    compare_series,
    diff,
    grads_differ,
    loss_and_grads,
    noise_floor,
    nonfinite_grads,
)

pytestmark = pytest.mark.fast

LOSSES = [1.76, 1.75, 1.74, 1.743]


def test_identical_series_pass():
    d = compare_series(LOSSES, list(LOSSES))
    assert d.identical and d.finite and d.max_abs == 0.0 and d.exact_steps == 4
    d.require_identical()
    d.require_within(0.0)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, None])
@pytest.mark.parametrize("side", ["graphed", "reference"])
def test_a_non_finite_step_on_either_side_fails(bad, side):
    broken = [*LOSSES[:2], bad, LOSSES[3]]
    a, b = (broken, LOSSES) if side == "graphed" else (LOSSES, broken)
    d = compare_series(a, b, name="loss")
    assert not d.finite and not d.identical and not d.within(1e9)
    assert math.isnan(d.max_abs) and d.nonfinite_steps == (2,)
    with pytest.raises(AssertionError, match="NOT FINITE at steps \\[2\\]"):
        d.require_identical()
    with pytest.raises(AssertionError, match="NOT FINITE"):
        d.require_within(1.0)


def test_the_recorded_pp2_run_is_not_identical():
    """``results/multi-gpu/two_gpus_run7a.json``, ``pp2_4mb``, last stage: NaN from step 4 on was recorded as 0.0 by
    max()."""
    graphed = [1.7605066299438477, 1.7547041177749634, 1.7420140504837036, 1.7428275346755981] + [math.nan] * 26
    reference = graphed[:4] + [1.74 - 0.001 * i for i in range(26)]
    assert max(abs(a - b) for a, b in zip(graphed, reference, strict=True)) == 0.0  # the defect
    d = compare_series(graphed, reference)
    assert not d.identical and len(d.nonfinite_steps) == 26 and d.exact_steps == 4


def test_a_real_difference_is_reported():
    d = compare_series([1.0, 2.0, 3.5], [1.0, 2.0, 3.0], name="grad norm")
    assert d.finite and not d.identical and d.exact_steps == 2
    assert d.max_abs == pytest.approx(0.5) and d.max_rel == pytest.approx(0.5 / 3.0)
    assert d.within(0.5) and not d.within(0.4)
    with pytest.raises(AssertionError, match="grad norm: 2 of 3 steps identical"):
        d.require_identical()


def test_a_missing_step_is_an_error():
    with pytest.raises(ValueError, match="3 steps against 4"):
        compare_series(LOSSES[:3], LOSSES)


def test_two_empty_series_are_an_error_not_identical():
    """Run 22's first 8B call: neither run trained, and the log comparison read the two empty series as identical."""
    with pytest.raises(ValueError, match="no steps"):
        compare_series([], [], name="loss")


def test_noise_floor_is_the_worst_pair_and_refuses_nan():
    assert noise_floor([[1.0, 2.0], [1.0, 2.5], [1.25, 2.0]]) == pytest.approx(0.5)
    with pytest.raises(AssertionError, match="NOT FINITE"):
        noise_floor([[1.0, 2.0], [1.0, math.nan]])


def _grads(**values):
    return {k: torch.tensor(v, dtype=torch.float32) for k, v in values.items()}


def test_diff_of_losses_and_gradients():
    loss = torch.tensor([[1.0, 2.0]])
    same = diff((loss, _grads(w=[1.0, 2.0])), (loss.clone(), _grads(w=[1.0, 2.0])))
    assert same.exact and same.within_bound()
    same.require_exact("same")
    off = diff((loss, _grads(w=[1.0, 2.5], v=[1.0])), (loss.clone(), _grads(w=[1.0, 2.0], v=[1.0])))
    assert off.loss_exact and not off.exact and off.grad_worst == "w" and off.grad_exact_fraction == 0.5
    with pytest.raises(AssertionError, match="not bit-identical"):
        off.require_exact("off")


def test_diff_names_the_parameters_furthest_apart_with_both_norms():
    """Run 83's question, which parameters and how: a zero gradient against a real one reads ``norm 0``."""
    loss = torch.tensor([[1.0, 2.0]])
    graphed = _grads(a=[0.0, 0.0], b=[1.0, 2.1], c=[3.0, 4.0])
    d = diff((loss, graphed), (loss.clone(), _grads(a=[3.0, 4.0], b=[1.0, 2.0], c=[3.0, 4.0])), worst=5)
    assert [p["name"] for p in d.grad_worst_params] == ["a", "b"]  # exact ones are not listed
    first = d.grad_worst_params[0]
    assert first["rel_l2"] == pytest.approx(1.0) and first["norm"] == 0.0 and first["reference_norm"] == 5.0
    assert diff((loss, graphed), (loss, graphed)).grad_worst_params == ()


def test_diff_compares_across_devices_and_on_the_loss_tokens_only():
    loss, ref = torch.tensor([[1.0, 2.0, 9.0]]), torch.tensor([[1.0, 2.0, 0.0]])
    grads = _grads(w=[1.0])
    assert not diff((loss, grads), (ref, grads)).loss_exact
    masked = diff((loss, grads), (ref, grads), loss_mask=torch.tensor([1.0, 1.0, 0.0]))
    assert masked.exact and masked.loss_max_abs == 0.0


def test_within_floor_is_exactness_under_an_exact_floor_and_twice_the_floor_otherwise():
    from bridge_cudagraph.testing.parity import Diff, within_floor

    exact_floor = Diff(0.0, 0.0, True)
    assert within_floor(Diff(0.0, 0.0, True), exact_floor)
    assert not within_floor(Diff(0.0, 0.0, True, grad_max_rel_l2=1e-7, grad_exact_fraction=0.9), exact_floor)
    floor = Diff(0.0, 0.0, True, grad_max_rel_l2=0.01, grad_exact_fraction=0.1)
    assert within_floor(Diff(0.0, 0.0, True, grad_max_rel_l2=0.02, grad_exact_fraction=0.0), floor)
    assert not within_floor(Diff(0.0, 0.0, True, grad_max_rel_l2=2.2, grad_exact_fraction=0.0), floor)  # run 83
    assert not within_floor(Diff(1e-6, 0.0, False, grad_max_rel_l2=0.0), floor)  # the loss must stay exact here
    assert not within_floor(Diff(0.0, 0.0, True, grad_max_rel_l2=math.nan), floor)
    missing = Diff(0.0, 0.0, True, grad_max_rel_l2=0.0, grad_missing=("w (reference only)",))
    assert not within_floor(missing, floor)


def test_grad_norm_is_every_gradient_together_and_keeps_nan():
    from bridge_cudagraph.testing.parity import grad_norm

    assert grad_norm(_grads(a=[3.0], b=[4.0], c=[0.0])) == pytest.approx(5.0)
    assert grad_norm({"a": None, **_grads(b=[2.0])}) == pytest.approx(2.0)
    assert math.isnan(grad_norm(_grads(a=[math.nan])))


@pytest.mark.parametrize("where", ["loss", "grad"])
def test_diff_fails_on_nan(where):
    loss, grads = torch.tensor([[1.0, 2.0]]), _grads(w=[1.0, 2.0])
    bad_loss = torch.tensor([[1.0, math.nan]]) if where == "loss" else loss.clone()
    bad_grads = _grads(w=[1.0, math.nan]) if where == "grad" else _grads(w=[1.0, 2.0])
    for a, b in (((bad_loss, bad_grads), (loss, grads)), ((loss, grads), (bad_loss, bad_grads))):
        d = diff(a, b)
        assert not d.exact and not d.within_bound(1e9, 1e9), d


def test_assert_captured():
    ok = CaptureStats(submodule="vision", graphs=12, replays=3)
    assert capture_problems(ok) == []
    assert_captured(ok)
    assert_captured({"graphs": 4, "replays": 27, "failed": None}, where="rank 0 language")
    for stats, message in (
        (CaptureStats(submodule="vision", graphs=12, replays=3, failed="OOM"), "vision: capture failed: OOM"),
        (CaptureStats(submodule="vision", graphs=0, replays=0), "vision: no graphs"),
        (CaptureStats(submodule="language", graphs=4, replays=0), "language: no replays"),
        ({"graphs": 16, "replays": 47, "failure": "RuntimeError: x"}, "capture failed: RuntimeError"),
    ):
        with pytest.raises(AssertionError, match=message):
            assert_captured(stats)


def test_optimizer_step_graph_installs_megatron_cores_wrapper_and_undoes_it():
    """Installed as Bridge's train() installs it; on exit the class-level graph, result and call count are cleared
    and the optimizer's own step is back (the graph itself is a GPU test)."""
    pytest.importorskip("megatron.core")
    from megatron.core.optimizer.optimizer_cuda_graph import OptimizerCudaGraphWrapper

    from bridge_cudagraph.testing.parity import optimizer_step_graph

    class Optimizer:
        def step(self):
            return "eager"

    opt = Optimizer()
    OptimizerCudaGraphWrapper.curr_iteration = 7  # left over from an earlier run in the process
    with optimizer_step_graph(opt, capture_at=2):
        assert isinstance(opt.step, OptimizerCudaGraphWrapper)
        assert opt.step.cuda_graph_warmup_steps == 2 and OptimizerCudaGraphWrapper.curr_iteration == 0
        OptimizerCudaGraphWrapper.result = ("held",)
    assert opt.step() == "eager"
    assert OptimizerCudaGraphWrapper.cuda_graph is None and OptimizerCudaGraphWrapper.result is None
    assert OptimizerCudaGraphWrapper.curr_iteration == 0


def test_a_gradient_missing_on_one_side_is_a_mismatch():
    """It used to become zeros on that side: a parameter the graphed run never reached compared "exact" with a
    reference whose gradient was zero, and against any reference it was never named."""
    loss = torch.tensor([[1.0, 2.0]])
    reached = {"w": torch.tensor([1.0, 2.0]), "v": torch.zeros(1)}
    not_reached = {"w": torch.tensor([1.0, 2.0]), "v": None}
    d = diff((loss, not_reached), (loss.clone(), reached))
    assert d.loss_exact and not d.exact and not d.within_bound(1e9, 1e9), d
    assert d.grad_missing == ("v (reference only)",) and d.grad_absent == () and d.grad_exact_fraction == 0.5
    assert d.as_dict()["grad_missing"] == ("v (reference only)",)
    with pytest.raises(AssertionError, match=r"gradient on one side only: \['v \(reference only\)'\]"):
        d.require_exact("graphed")
    d = diff((loss, reached), (loss.clone(), not_reached))
    assert not d.exact and d.grad_missing == ("v (graphed only)",)


def test_a_gradient_missing_on_both_sides_is_reported_not_compared():
    loss = torch.tensor([[1.0, 2.0]])
    a = (loss, {"w": torch.tensor([1.0, 2.0]), "frozen_by_the_batch": None})
    b = (loss.clone(), {"w": torch.tensor([1.0, 2.0]), "frozen_by_the_batch": None})
    d = diff(a, b)
    assert d.exact and d.grad_absent == ("frozen_by_the_batch",) and d.grad_missing == ()
    assert d.grad_exact_fraction == 1.0 and d.as_dict()["grad_absent"] == ("frozen_by_the_batch",)
    d.require_exact("both")


def test_a_missing_gradient_after_a_non_finite_one_is_still_named():
    loss = torch.tensor([[1.0]])
    a = (loss, {"x": torch.tensor([math.nan]), "y": None})
    b = (loss.clone(), {"x": torch.tensor([1.0]), "y": torch.tensor([1.0])})
    d = diff(a, b)
    assert (
        math.isnan(d.grad_max_rel_l2)
        and d.grad_worst == "x (not finite)"
        and d.grad_missing == ("y (reference only)",)
    )


def test_loss_and_grads_keeps_a_missing_gradient_missing():
    """A real backward through a module one of whose parameters the loss never reaches: ``None``, not zeros."""

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.used = torch.nn.Linear(2, 1)
            self.unused = torch.nn.Linear(2, 1)
            self.frozen = torch.nn.Parameter(torch.ones(1), requires_grad=False)

        def zero_grad_buffer(self):
            self.zero_grad(set_to_none=True)

        def forward(self, x):
            return self.used(x).squeeze(-1)

    torch.manual_seed(0)
    model = Model()
    batch = {"x": torch.ones(1, 3, 2)}
    loss, grads = loss_and_grads([model], batch)
    assert loss.shape == (1, 3) and set(grads) == {"used.weight", "used.bias", "unused.weight", "unused.bias"}
    assert grads["unused.weight"] is None and grads["unused.bias"] is None
    assert torch.equal(grads["used.bias"], torch.ones(1))
    assert nonfinite_grads(grads) == [] and grads_differ(grads, grads) == []
    zeros = {**grads, "unused.weight": torch.zeros(1, 2)}
    assert grads_differ(grads, zeros) == ["unused.weight"] and grads_differ(zeros, grads) == ["unused.weight"]
    assert nonfinite_grads({**grads, "used.bias": torch.tensor([math.inf])}) == ["used.bias"]
    d = diff((loss, grads), (loss.clone(), zeros))
    assert not d.exact and d.grad_missing == ("unused.weight (reference only)",)
    assert d.grad_absent == ("unused.bias",)


def test_the_parity_forward_step_runs_the_model_in_a_micro_batch_with_the_batchs_cpu_grids():
    """:func:`per_token_loss` is the parity's forward step: the model runs inside a micro-batch holding the batch's
    CPU grids (not a model argument), closed when the model returns or raises."""
    from bridge_cudagraph.micro_batch import CpuGrids, current_micro_batch
    from bridge_cudagraph.testing.parity import per_token_loss
    from bridge_cudagraph.testing.step_batch import CPU_GRIDS

    seen = []

    class Model(torch.nn.Module):
        def forward(self, input_ids, fail=False):
            seen.append((current_micro_batch(), current_micro_batch().cpu_grids))
            if fail:
                raise RuntimeError("the model failed")
            return input_ids.float()

    grids = CpuGrids({"image_grid_thw": torch.tensor([[1, 2, 2]])})
    batch = {"input_ids": torch.ones(1, 3), CPU_GRIDS: grids}
    assert torch.equal(per_token_loss([Model()], batch), torch.ones(1, 3))
    with pytest.raises(RuntimeError, match="the model failed"):
        per_token_loss([Model()], {**batch, "fail": True})
    (first, first_grids), (second, second_grids) = seen
    assert first_grids is grids and second_grids is grids and first is not second
    assert current_micro_batch() is None and not first.open and not second.open
