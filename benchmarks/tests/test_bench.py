"""bench.py's CPU parts: the phase markers under a real CPU ``torch.profiler``, the variant order and the noise-floor
control, the variant loop and the incremental bench.json with a fake variant runner, and the command line."""

from __future__ import annotations

import argparse
import itertools
import json

import pytest
import torch

from benchmarks import bench, bench_gpus, bench_report, bench_trace
from benchmarks import configs as bench_configs


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
        if e.get("cat") == "user_annotation" and name.startswith(bench_trace.PHASE_PREFIX):
            out.setdefault(name[len(bench_trace.PHASE_PREFIX) :], []).append((e["ts"], e["ts"] + e["dur"]))
    return {k: sorted(v) for k, v in out.items()}


def test_phase_markers_mark_a_real_step_and_leave_nothing_behind(tmp_path):
    model = [_Wrapper()]
    optimizer = torch.optim.SGD(model[0].parameters(), lr=0.1)
    assert bench.submodules_named(model, "vision_model") == [model[0].module.vision_model]
    markers = bench.PhaseMarkers(model, optimizer)
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
    host = bench_trace.host_time_breakdown(trace)
    walls = {k: v["wall_ms_per_step"] for k, v in host["by_phase"].items()}
    assert sum(walls.values()) == pytest.approx(host["window_ms_per_step"])
    assert host["idle_ms_per_step"] == pytest.approx(host["window_ms_per_step"])
    assert walls.get(bench_trace.UNMARKED, 0.0) < 0.2 * host["window_ms_per_step"]
    assert {r["name"] for r in host["top_cpu_ops"]} & {"aten::linear", "Optimizer.step#SGD.step", "aten::mm"}

    # Removed: no hook left, optimizer.step is the class's again, and a profiled step has no phase marker.
    for module in model[0].modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
    assert "step" not in vars(optimizer)
    prof = _profiled_steps(model, optimizer, None, steps=1)
    prof.export_chrome_trace(str(path))
    assert _phase_ranges(json.loads(path.read_text())) == {}


# ------------------------------------------------------------------------------------------ variants and control
def test_run_order_puts_eager_first_and_the_control_last():
    assert bench.run_order(["ours", "eager_repeat", "upstream"]) == ["eager", "ours", "upstream", "eager_repeat"]
    assert bench.run_order(["ours"]) == ["eager", "ours"]
    assert bench.run_order(bench.DEFAULT_VARIANTS) == ["eager", "upstream", "ours", "eager_repeat"]


def test_run_order_puts_the_full_iteration_graph_after_the_control_and_in_one_round_only():
    # A failed full-iteration capture leaves the CUDA generators registered with the abandoned graph (run 65: the
    # control after it failed), so nothing may run after it in the process.
    chosen = ["upstream_full_iteration", "ours", "eager_repeat"]
    assert bench.run_order(chosen) == ["eager", "ours", "eager_repeat", "upstream_full_iteration"]
    assert bench.run_plan(chosen, 2) == [
        ("eager", 1),
        ("ours", 1),
        ("eager_repeat", 1),
        ("ours", 2),
        ("upstream_full_iteration", 1),
    ]
    with pytest.raises(ValueError, match="unknown variants"):
        bench.run_order(["eager", "fast"])
    # ours' speed levers run where they are named, in the order given, between eager and the control
    levers = ["upstream", "ours", "ours_per_layer", "ours_optgraph", "eager_repeat"]
    assert bench.run_order(levers) == ["eager", *levers]


def test_select_variants_adds_or_removes_the_control():
    assert bench.select_variants("eager,upstream,ours") == ["eager", "upstream", "ours", "eager_repeat"]
    assert bench.select_variants("ours,eager_repeat", control=False) == ["ours"]
    assert bench.select_variants(None, control=False) == ["eager", "upstream", "ours"]


def test_the_control_is_built_like_eager():
    cfg = bench_configs.tiny_config()
    control = bench.variant_provider(cfg, "eager_repeat")
    eager = bench.variant_provider(cfg, "eager")
    assert type(control) is type(eager)
    control.finalize()
    assert control.cuda_graph_impl == "none" and not control.cuda_graph.any_enabled


def _fake_rec(variant: str, losses: list[float]) -> dict:
    step_ms = {"eager": 100.0, "eager_repeat": 101.0, "upstream": 50.0, "ours": 40.0}[variant]
    return {"status": "ok", "step_ms_median": step_ms, "losses": losses}


def test_run_config_runs_the_control_last_and_reports_progress(monkeypatch):
    """The variant loop with a fake variant runner: order, per-variant progress, and the noise-floor verdict
    (ours drifts 3e-2, eager vs eager 2e-2: within 3x)."""
    losses = {
        "eager": [1.0, 0.9, 0.8],
        "upstream": [1.0, 1.5, 1.4],
        "ours": [1.0, 0.93, 0.8],
        "eager_repeat": [1.0, 0.92, 0.8],
    }
    calls, progress = [], []

    def fake_run_variant(shared, variant, timing_only=False):
        calls.append(variant)
        rec = _fake_rec(variant, losses[variant])
        if variant != "eager":
            diffs = [abs(a - b) for a, b in zip(losses[variant], losses["eager"], strict=True)]
            rec.update(loss_abs_diff_per_step=diffs, loss_max_abs_diff_vs_eager=max(diffs))
        return rec

    monkeypatch.setattr(bench, "_run_variant", fake_run_variant)
    monkeypatch.setattr(bench, "make_batch", lambda cfg, images, seed, device="cuda": {"seed": seed})
    out = bench.run_config(
        bench_configs.tiny_config(),
        world=None,
        measured_steps=2,
        warmup_steps=1,
        profile=False,
        profiler_sees_graph_kernels=None,
        variants=["ours", "upstream", "eager_repeat"],
        rounds=1,
        paired=False,
        on_progress=lambda partial: progress.append(json.loads(json.dumps(partial))),
    )
    assert calls == ["eager", "ours", "upstream", "eager_repeat"]
    assert [p["status"] for p in progress] == ["running"] * 4
    assert [list(p["variants"]) for p in progress] == [calls[: i + 1] for i in range(4)]
    assert out["status"] == bench_report.FINISHED
    v = out["variants"]
    assert v["ours"]["speedup_vs_eager"] == pytest.approx(2.5)
    assert v["eager_repeat"]["speedup_vs_eager"] == pytest.approx(100 / 101)
    assert v["ours"]["vs_noise_floor"]["within"] is True
    assert v["ours"]["vs_noise_floor"]["ratio"] == pytest.approx(1.5)
    assert v["upstream"]["vs_noise_floor"]["within"] is False
    assert "vs_noise_floor" not in v["eager_repeat"] and "vs_noise_floor" not in v["eager"]


def test_run_plan_times_the_graphed_variants_again_in_reverse_after_the_control():
    assert bench.run_plan(bench.DEFAULT_VARIANTS, 1) == [(v, 1) for v in ("eager", "upstream", "ours", "eager_repeat")]
    assert bench.run_plan(bench.DEFAULT_VARIANTS, 2)[4:] == [("ours", 2), ("upstream", 2)]
    assert bench.run_plan(bench.DEFAULT_VARIANTS, 3)[4:] == [
        ("ours", 2),
        ("upstream", 2),
        ("upstream", 3),
        ("ours", 3),
    ]
    assert bench.run_plan(["eager", "ours"], 2) == [("eager", 1), ("ours", 1), ("ours", 2)]
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        bench.run_plan(bench.DEFAULT_VARIANTS, 0)


def _run_tiny_config_with(monkeypatch, fake_run_variant, **kwargs) -> dict:
    """run_config on the tiny configuration with ``fake_run_variant`` standing in for the GPU work."""
    monkeypatch.setattr(bench, "_run_variant", fake_run_variant)
    monkeypatch.setattr(bench, "make_batch", lambda cfg, images, seed, device="cuda": {})
    kwargs = {"measured_steps": 2, "warmup_steps": 1, "profile": False, "profiler_sees_graph_kernels": None, **kwargs}
    return bench.run_config(bench_configs.tiny_config(), None, **kwargs)


def test_run_config_adds_timing_rounds_to_the_graphed_variants(monkeypatch):
    """Round 2 runs timing-only after the control, in reverse order; its record lands in the first round's
    ``repeat_rounds`` with its place in the run order, and the report judges ours vs upstream on the rounds."""
    medians = {("upstream", 1): 50.0, ("ours", 1): 40.0, ("ours", 2): 41.0, ("upstream", 2): 51.0}
    calls = []

    def fake_run_variant(shared, variant, timing_only=False):
        round_ = 2 if timing_only else 1
        calls.append((variant, timing_only))
        rec = _fake_rec(variant, [1.0, 0.9, 0.8])
        if (variant, round_) in medians:
            rec["step_ms_median"] = medians[variant, round_]
        return rec

    out = _run_tiny_config_with(monkeypatch, fake_run_variant, rounds=2, paired=False)
    assert calls == [
        ("eager", False),
        ("upstream", False),
        ("ours", False),
        ("eager_repeat", False),
        ("ours", True),
        ("upstream", True),
    ]
    v = out["variants"]
    assert [r["position"] for r in (v["upstream"], *v["upstream"]["repeat_rounds"])] == [1, 5]
    assert [(r["round"], r["position"]) for r in v["ours"]["repeat_rounds"]] == [(2, 4)]
    assert v["ours"]["speedup_vs_eager"] == pytest.approx(100 / 40)  # first round only
    judged = bench_report.speed_vs_upstream(v)
    assert judged["noise_source"] == "rounds" and judged["verdict"] == "faster"
    assert judged["ratio"] == pytest.approx(101 / 81)


def test_run_config_does_not_time_again_a_variant_that_failed(monkeypatch):
    calls = []

    def fake_run_variant(shared, variant, timing_only=False):
        calls.append((variant, timing_only))
        rec = _fake_rec(variant, [1.0])
        if variant == "upstream":
            rec = {"status": "failed", "error": "boom"}
        return rec

    out = _run_tiny_config_with(monkeypatch, fake_run_variant, rounds=2, paired=False)
    assert ("upstream", True) not in calls and ("ours", True) in calls
    assert "repeat_rounds" not in out["variants"]["upstream"]


def _peaks(upstream_gib: float, ours_gib: float, start_gib: float = 1.0) -> dict:
    return {
        name: {"status": "ok", "peak_memory_bytes": gib * 2**30, "allocated_at_start_bytes": start_gib * 2**30}
        for name, gib in (("upstream", upstream_gib), ("ours", ours_gib))
    }


def test_paired_memory_check_sums_the_peaks_and_counts_the_shared_start_once():
    total = 140 * 2**30
    assert bench.paired_memory_check(_peaks(45, 45), total) is None  # mbs 1 / seq 2048 on an H200
    reason = bench.paired_memory_check(_peaks(77, 76), total)  # mbs 2 / seq 4096
    assert "152.0 GiB" in reason and "90% of the GPU's 140.0 GiB" in reason
    failed = {**_peaks(45, 45), "ours": {"status": "failed"}}
    assert "did not finish" in bench.paired_memory_check(failed, total)


def test_run_config_runs_the_paired_phase_last_or_says_why_not(monkeypatch):
    monkeypatch.setattr(bench, "_gpu_memory_bytes", lambda: 140 * 2**30)
    peaks = {"upstream": 45, "ours": 45}

    def fake_run_variant(shared, variant, timing_only=False):
        rec = _fake_rec(variant, [1.0])
        rec.update(peak_memory_bytes=peaks.get(variant, 10) * 2**30, allocated_at_start_bytes=0)
        return rec

    def fake_run_paired(shared):
        return {"status": "ok", "ratios": [1.1] * 30, "step_ms_median": {"upstream": 55.0, "ours": 50.0}}

    monkeypatch.setattr(bench, "_run_paired", fake_run_paired)
    out = _run_tiny_config_with(monkeypatch, fake_run_variant)
    assert out["paired"]["status"] == "ok" and out["paired"]["position"] == 4
    judged = bench_report.speed_vs_upstream(out["variants"], out["paired"])
    assert judged["noise_source"] == "paired" and judged["verdict"] == "faster"
    peaks.update(upstream=77, ours=76)
    out = _run_tiny_config_with(monkeypatch, fake_run_variant)
    assert out["paired"]["status"] == "skipped" and "over 90%" in out["paired"]["reason"]
    assert "paired" not in _run_tiny_config_with(monkeypatch, fake_run_variant, paired=False)


def test_run_config_stops_when_eager_fails(monkeypatch):
    calls = []

    def fake_run_variant(shared, variant, timing_only=False):
        calls.append(variant)
        return {"status": "failed", "error": "boom"}

    monkeypatch.setattr(bench, "_run_variant", fake_run_variant)
    monkeypatch.setattr(bench, "make_batch", lambda cfg, images, seed, device="cuda": {})
    out = bench.run_config(
        bench_configs.tiny_config(),
        None,
        measured_steps=1,
        warmup_steps=0,
        profile=False,
        profiler_sees_graph_kernels=None,
    )
    assert calls == ["eager"] and list(out["variants"]) == ["eager"]


def test_run_writes_bench_json_after_every_variant(monkeypatch, tmp_path):
    """A process killed in the middle of a configuration keeps the variants it finished: run() rewrites bench.json
    with the configuration in progress marked "running"."""
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "_meta", lambda **kw: {"command": "test"})
    seen = []

    def fake_run_config(cfg, world, *, on_progress, **kwargs):
        seen.append(cfg.name)
        partial = {"name": cfg.name, "status": "running", "variants": {"eager": {"status": "ok"}}}
        on_progress(partial)
        if cfg.name != "tiny":
            raise RuntimeError("killed")  # what a kill looks like from here: nothing after this point
        return {**partial, "status": "complete"}

    monkeypatch.setattr(bench, "run_config", fake_run_config)
    with pytest.raises(RuntimeError, match="killed"):
        bench.run(["tiny", "small-mbs1-seq2048"], out_dir=tmp_path, profile=False, world=object())
    data = json.loads((tmp_path / "bench.json").read_text())
    assert seen == ["tiny", "small-mbs1-seq2048"]
    assert [(c["name"], c["status"]) for c in data["configs"]] == [
        ("tiny", "complete"),
        ("small-mbs1-seq2048", "running"),
    ]
    assert data["meta"]["noise_floor_control"] is True
    assert data["meta"]["variants"] == ["eager", "upstream", "ours", "eager_repeat"]
    assert (tmp_path / "bench.md").exists()  # rendered after the finished configuration


# ------------------------------------------------------------------------------------------ several GPUs: pure


def test_main_with_gpus_dispatches_to_children(monkeypatch, tmp_path):
    seen = {}

    def fake_run_on_gpus(configs, devices, *, out_dir, make_argv, time_limit_s, **kw):
        seen.update(configs=[c.name for c in configs], devices=devices, limit=time_limit_s, out=out_dir)
        seen["argv"] = make_argv(["tiny"], tmp_path / "p0")
        return {"configs": [{"name": "tiny", "status": "complete", "variants": {"ours": {"status": "ok"}}}]}, []

    monkeypatch.setattr(bench_gpus, "run_on_gpus", fake_run_on_gpus)
    monkeypatch.setattr(bench, "run", lambda *a, **k: pytest.fail("--gpus must not run in-process"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    rc = bench.main(["--out", str(tmp_path), "--quick", "--gpus", "2", "--time-limit", "500", "--no-control"])
    assert rc == 0
    assert seen["configs"] == ["tiny", "small-mbs1-seq2048"] and seen["devices"] == ["2", "3"]
    assert seen["limit"] == 500 and seen["out"] == str(tmp_path)
    assert "--no-control" in seen["argv"] and "--gpus" not in seen["argv"]

    def unfinished(*a, **k):
        return {"configs": [{"name": "tiny", "status": "failed", "variants": {}}]}, []

    monkeypatch.setattr(bench_gpus, "run_on_gpus", unfinished)
    assert bench.main(["--out", str(tmp_path), "--configs", "tiny", "--devices", "0"]) == 1


def test_time_limit_needs_children(tmp_path):
    with pytest.raises(SystemExit, match="--gpus"):
        bench.main(["--out", str(tmp_path), "--configs", "tiny", "--time-limit", "5"])


def test_gpus_flag_parses():
    ns = bench._parse(["--gpus", "2", "--devices", "0,1", "--time-limit", "1.5"])
    assert isinstance(ns, argparse.Namespace) and ns.gpus == 2 and ns.devices == "0,1" and ns.time_limit == 1.5


def test_break_ddp_cycles_drops_grad_accs_of_every_chunk():
    chunks = [torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)]
    chunks[0].grad_accs = [object(), object()]  # what Megatron's DDP keeps (AccumulateGrad nodes)
    bench._break_ddp_cycles(chunks)
    assert chunks[0].grad_accs == [] and not hasattr(chunks[1], "grad_accs")
    bench._break_ddp_cycles(None)


def test_teardown_returns_only_what_outlives_it():
    kept = torch.nn.Linear(1, 1)  # something outside the benchmark still holds this chunk
    objs = {"model": [torch.nn.Linear(1, 1), kept], "optimizer": torch.optim.SGD(kept.parameters(), lr=0.1)}
    assert bench._teardown(objs) == {"model": [kept]}  # the other chunk and the optimizer were freed
    assert objs == {}
    optimizer = torch.optim.SGD(kept.parameters(), lr=0.1)
    assert bench._teardown({"model": None, "optimizer": optimizer}) == {"optimizer": optimizer}


# ------------------------------------------------------------------------------------------ non-finite steps


def test_a_nan_step_is_not_reported_as_no_difference():
    """Python's max() skips NaN (max([0.0, nan]) == 0.0): a NaN loss must leave no difference to report, and
    fail the variant, on either side of the comparison."""
    nan = float("nan")
    assert max([0.0, nan]) == 0.0  # the trap
    same = bench.compare_steps([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], grad_norms=[1.0] * 3, reference_grad_norms=[1.0] * 3)
    assert same["loss_max_abs_diff_vs_eager"] == 0.0 and same["exact_steps"] == 3 and "not_compared" not in same
    for ours, eager in (([1.0, nan, 3.0], [1.0, 2.0, 3.0]), ([1.0, 2.0, 3.0], [1.0, 2.0, float("inf")])):
        out = bench.compare_steps(ours, eager, warmup_steps=1)
        assert out["loss_max_abs_diff_vs_eager"] is None and out["loss_max_abs_diff_after_capture"] is None
        assert out["exact_steps"] is None and out["not_compared"]
    grads = bench.compare_steps([1.0, 2.0], [1.0, 2.0], grad_norms=[1.0, nan], reference_grad_norms=[1.0, 1.0])
    assert grads["not_compared"] == {"grad_norms": [1]} and grads["loss_max_abs_diff_vs_eager"] is None
    with pytest.raises(bench.NonFiniteStepError, match=r"loss at steps \[1\]"):
        bench.require_finite([1.0, nan, 3.0])
    with pytest.raises(bench.NonFiniteStepError, match="grad norm"):
        bench.require_finite([1.0], [float("inf")])
    bench.require_finite([1.0, 2.0], [0.5, 0.5])


def test_lever_pairs_are_two_different_variants_of_ours():
    assert bench.parse_lever_pairs("ours_per_layer:ours, ours:ours_optgraph") == [
        ("ours_per_layer", "ours"),
        ("ours", "ours_optgraph"),
    ]
    assert bench.parse_lever_pairs("") == []
    for bad in ("ours", "ours:ours", "upstream:ours", "ours:fast"):
        with pytest.raises(ValueError, match="--lever-pairs"):
            bench.parse_lever_pairs(bad)
