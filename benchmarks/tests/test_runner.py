"""The variant runner's CPU parts: the phase markers under a real CPU ``torch.profiler`` and the host-time breakdown of
that trace, the paired phase's memory check, the teardown's survivors, and the non-finite step check."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

from benchmarks import runner
from benchmarks import trace as bt


class _Vision(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.patch_embed = torch.nn.Linear(8, 8)
        self.block = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.patch_embed(x)
        return self.block(h).relu(), [h]


class _Language(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(8, 1)

    def forward(self, h):
        return self.head(h).pow(2).mean()


class _Toy(torch.nn.Module):
    """Qwen3-VL's shape as the markers see it: ``vision_model`` and ``language_model`` attributes."""

    def __init__(self):
        super().__init__()
        self.vision_model = _Vision()
        self.language_model = _Language()

    def forward(self, x):
        v, _ = self.vision_model(x)
        return self.language_model(v * 2)


class _Wrapper(torch.nn.Module):
    """What DDP(Float16Module(model)) looks like from outside: the model one ``module`` deeper."""

    def __init__(self):
        super().__init__()
        self.module = _Toy()

    def forward(self, x):
        return self.module(x)


def _profiled_steps(model, optimizer, markers, steps=2):
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(4, 8)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for j in range(steps):
            with torch.profiler.record_function(f"bench_step_{j}"):
                if markers is not None:
                    markers.start_step()
                optimizer.zero_grad()
                model[0](x).backward()
                optimizer.step()
                if markers is not None:
                    markers.end_step()
    return prof


def _phase_ranges(trace):
    out = {}
    for e in trace["traceEvents"]:
        name = str(e.get("name", ""))
        if e.get("cat") == "user_annotation" and name.startswith(bt.PHASE_PREFIX):
            out.setdefault(name[len(bt.PHASE_PREFIX) :], []).append((e["ts"], e["ts"] + e["dur"]))
    return {k: sorted(v) for k, v in out.items()}


def test_phase_markers_mark_a_real_step_and_leave_nothing_behind(tmp_path):
    model = [_Wrapper()]
    optimizer = torch.optim.SGD(model[0].parameters(), lr=0.1)
    assert runner.submodules_named(model, "vision_model") == [model[0].module.vision_model]
    markers = runner.PhaseMarkers(model, optimizer)
    try:
        prof = _profiled_steps(model, optimizer, markers)
    finally:
        markers.remove()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    ranges = _phase_ranges(trace)
    expected = {
        "step_setup",
        "forward",
        "vision_forward",
        "language_forward",
        "backward",
        "vision_backward",
        "optimizer_step",
        "step_end",
    }
    assert set(ranges) == expected
    assert all(len(v) == 2 for v in ranges.values()), ranges  # once per step

    def inside(inner, outer):
        return all(any(o0 <= i0 and i1 <= o1 for o0, o1 in ranges[outer]) for i0, i1 in ranges[inner])

    assert inside("vision_forward", "forward") and inside("language_forward", "forward")
    assert inside("vision_backward", "backward")
    for j in range(2):  # the main-thread phases follow one another
        seq = [ranges[p][j] for p in ("step_setup", "forward", "backward", "optimizer_step", "step_end")]
        assert all(a[1] <= b[0] + 1 for a, b in itertools.pairwise(seq)), seq
    # The breakdown on that real trace: no kernels on a CPU run, so the whole step is "idle", and the phases cover
    # it: the part under no marker is only the marker calls' own cost at the step's edges.
    host = bt.host_time_breakdown(trace)
    walls = {k: v["wall_ms_per_step"] for k, v in host["by_phase"].items()}
    assert sum(walls.values()) == pytest.approx(host["window_ms_per_step"])
    assert host["idle_ms_per_step"] == pytest.approx(host["window_ms_per_step"])
    assert walls.get(bt.UNMARKED, 0.0) < 0.2 * host["window_ms_per_step"]
    assert {r["name"] for r in host["top_cpu_ops"]} & {"aten::linear", "Optimizer.step#SGD.step", "aten::mm"}

    # Removed: no hook left, optimizer.step is the class's again, and a profiled step has no phase marker.
    for module in model[0].modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
    assert "step" not in vars(optimizer)
    prof = _profiled_steps(model, optimizer, None, steps=1)
    prof.export_chrome_trace(str(path))
    assert _phase_ranges(json.loads(path.read_text())) == {}


PAIR = ("upstream", "ours")


def _peaks(upstream_gib: float, ours_gib: float, start_gib: float = 1.0) -> dict:
    return {
        name: {"status": "ok", "peak_memory_bytes": gib * 2**30, "allocated_at_start_bytes": start_gib * 2**30}
        for name, gib in (("upstream", upstream_gib), ("ours", ours_gib))
    }


def test_paired_memory_check_sums_the_peaks_and_counts_the_shared_start_once():
    total = 140 * 2**30
    assert runner.paired_memory_check(_peaks(45, 45), total, PAIR) is None  # mbs 1 / seq 2048 on an H200
    reason = runner.paired_memory_check(_peaks(77, 76), total, PAIR)  # mbs 2 / seq 4096
    assert "152.0 GiB" in reason and "90% of the GPU's 140.0 GiB" in reason
    failed = {**_peaks(45, 45), "ours": {"status": "failed"}}
    assert "did not finish" in runner.paired_memory_check(failed, total, PAIR)


def test_break_ddp_cycles_drops_grad_accs_of_every_chunk():
    chunks = [torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)]
    chunks[0].grad_accs = [object(), object()]  # what Megatron's DDP keeps (AccumulateGrad nodes)
    runner.break_ddp_cycles(chunks)
    assert chunks[0].grad_accs == [] and not hasattr(chunks[1], "grad_accs")
    runner.break_ddp_cycles(None)


class _Dispatcher:
    """Like megatron-core's MoE token dispatcher: a plain object on the layer that keeps the router's probabilities
    of the last forward."""

    probs: torch.Tensor | None = None


class _MoELike(torch.nn.Module):
    """A DDP-like chunk: a hook on each parameter's AccumulateGrad node closes over the chunk (Megatron's DDP), and
    the layer's dispatcher keeps a tensor of the last forward, so that forward's graph (and with it those nodes)
    outlives the step."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4))
        self.token_dispatcher = _Dispatcher()
        self.grad_accs = []
        acc = self.weight.expand_as(self.weight).grad_fn.next_functions[0][0]
        chunk = self

        def hook(*_grads: object) -> None:  # its closure holds the chunk, as DDP's hook holds DDP
            assert chunk is not None

        acc.register_hook(hook)
        self.grad_accs.append(acc)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.token_dispatcher.probs = (self.weight * x).softmax(-1)
        return (self.token_dispatcher.probs * x).sum()


def test_teardown_frees_a_model_whose_layers_keep_the_last_forwards_graph():
    """MoE models outlived every variant (34 GiB of the 30B-A3B shape): the dispatcher's ``probs`` kept the
    step's graph, whose AccumulateGrad nodes held DDP's hooks. Teardown drops such tensors, so the chunk is freed."""
    import weakref

    chunk = _MoELike()
    chunk(torch.ones(4)).backward()
    ref = weakref.ref(chunk)
    objs = {"model": [chunk]}
    del chunk
    assert runner.teardown(objs) == {} and ref() is None
    kept = _MoELike()
    kept(torch.ones(4)).backward()
    runner.drop_kept_graphs([kept])
    assert kept.token_dispatcher.probs is None and isinstance(kept.weight, torch.nn.Parameter)


def test_teardown_returns_only_what_outlives_it():
    kept = torch.nn.Linear(1, 1)  # something outside the benchmark still holds this chunk
    objs = {"model": [torch.nn.Linear(1, 1), kept], "optimizer": torch.optim.SGD(kept.parameters(), lr=0.1)}
    assert runner.teardown(objs) == {"model": [kept]}  # the other chunk and the optimizer were freed
    assert objs == {}
    optimizer = torch.optim.SGD(kept.parameters(), lr=0.1)
    assert runner.teardown({"model": None, "optimizer": optimizer}) == {"optimizer": optimizer}


def test_a_nan_or_inf_step_fails_the_variant():
    """Python's max() skips NaN (max([0.0, nan]) == 0.0): a NaN or infinite loss or grad norm at any step names the
    step and fails the variant, never reads as no difference."""
    nan = float("nan")
    assert max([0.0, nan]) == 0.0  # the trap
    assert runner.non_finite_steps([1.0, nan, 3.0, float("inf"), None]) == [1, 3, 4]
    with pytest.raises(runner.NonFiniteStepError, match=r"loss at steps \[1\]"):
        runner.require_finite([1.0, nan, 3.0])
    with pytest.raises(runner.NonFiniteStepError, match="grad norm"):
        runner.require_finite([1.0], [float("inf")])
    runner.require_finite([1.0, 2.0], [0.5, 0.5])


def test_json_safe_makes_nan_and_inf_null():
    out = runner.json_safe({"a": float("nan"), 1: (1.0, math.inf), "b": {"c": [2.0]}})
    assert out == {"a": None, "1": [1.0, None], "b": {"c": [2.0]}}
    json.dumps(out, allow_nan=False)


def test_vision_time_per_call_is_the_median_of_the_measured_calls():
    calls = [(1.0, 2.0), (3.0, 4.0), (2.0, None), (5.0, 6.0)]  # the third call's backward did not reach the encoder
    got = runner.VisionTimer.summary(calls, steps=2)
    assert got["vision_calls"] == 4 and got["vision_microbatches_per_step"] == 2.0
    assert got["vision_fwd_ms"] == 2.5 and got["vision_bwd_ms"] == 4.0 and got["vision_ms"] == 7.0  # 3, 7, 11
    fwd_only = runner.VisionTimer.summary([(1.0, None), (3.0, None)], steps=1)
    assert fwd_only["vision_bwd_ms"] is None and fwd_only["vision_ms"] == 2.0
    assert runner.VisionTimer.summary([], steps=3)["vision_ms"] is None


def test_mfu_of_the_measured_steps_and_at_the_profiled_steps_kernel_time():
    # 2 steps of 1e12 and 3e12 FLOPs in 10 ms and 30 ms: 1e14 FLOP/s = 100 TFLOP/s, 10% of a 1000 TFLOP/s peak.
    got = runner.model_flops_utilisation([1e12, 3e12], [10.0, 30.0], [2e12], kernel_ms=4.0, peak=1000.0)
    assert got["model_flops_per_step"] == 2e12 and got["model_tflops_per_s"] == pytest.approx(100.0)
    assert got["mfu"] == pytest.approx(0.1)
    assert got["mfu_at_kernel_time"] == pytest.approx(2e12 / 4e-3 / 1e15)  # 0.5
    no_peak = runner.model_flops_utilisation([1e12], [10.0], [1e12], kernel_ms=None, peak=None)
    assert no_peak["mfu"] is None and "mfu_at_kernel_time" not in no_peak
    assert runner.model_flops_utilisation([], [10.0], [], kernel_ms=1.0, peak=1000.0) == {}
