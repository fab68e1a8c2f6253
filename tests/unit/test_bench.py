"""bench.py's CPU parts added for the noise floor, the host-time attribution and the multi-GPU split: pure
functions on hand-built traces and configurations with known answers, the phase markers under a real CPU
``torch.profiler``, the variant loop and the incremental bench.json with a fake variant runner, and the process
orchestration with a fake child command (no GPU anywhere)."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import textwrap

import pytest
import torch

from bridge_cudagraph import bench, bench_report


# ------------------------------------------------------------------------------------------ host time: pure parts
def test_idle_intervals_are_the_window_minus_the_kernel_union():
    busy = [(100, 300), (250, 400), (600, 700), (-50, 20), (990, 1200)]
    assert bench.idle_intervals((0, 1000), busy) == [(20, 100), (400, 600), (700, 990)]
    assert bench.idle_intervals((0, 10), []) == [(0, 10)]
    assert bench.idle_intervals((0, 10), [(0, 10)]) == []
    assert bench.idle_intervals((0, 10), [(20, 30)]) == [(0, 10)]  # a kernel outside the window is no help


def test_merge_intervals():
    assert bench.merge_intervals([(5, 6), (0, 2), (1, 3), (3, 4), (7, 7)]) == [(0, 4), (5, 6)]


def test_outermost_keeps_only_top_level_ranges_per_thread():
    ranges = [
        (0, 10, "aten::linear", 1),
        (1, 9, "aten::addmm", 1),  # nested in linear
        (2, 3, "aten::view", 1),  # nested twice
        (9.5, 10.2, "aten::rounding", 1),  # starts inside linear, ends a hair after: nested
        (10, 12, "aten::add", 1),  # starts where linear ends: top level
        (1, 9, "aten::mul", 2),  # another thread: top level there
    ]
    assert [r[2] for r in bench.outermost(ranges)] == ["aten::linear", "aten::mul", "aten::add"]


def test_attribute_innermost_splits_targets_by_the_latest_started_cover():
    targets = [(0, 100), (400, 600), (700, 1000)]
    labelled = [
        (0, 50, "setup"),
        (50, 500, "forward"),
        (60, 450, "vision"),  # nested in forward
        (500, 900, "backward"),
        (650, 800, "vision_bwd"),  # another thread, inside backward
        (300, 300, "empty"),  # zero length: ignored
    ]
    out = bench.attribute_innermost(targets, labelled)
    assert out == pytest.approx(
        {"setup": 50, "forward": 60, "vision": 90, "backward": 200, "vision_bwd": 100, bench.UNMARKED: 100}
    )
    assert sum(out.values()) == pytest.approx(600)
    assert bench.attribute_innermost([(0, 5)], [], default="x") == {"x": 5}


def test_overlap_by_name_counts_overlap_calls_and_duration():
    targets = [(0, 100), (400, 600), (700, 1000)]
    ranges = [(20, 120, "a", 1), (420, 580, "b", 1), (950, 980, "b", 1), (100, 400, "c", 1)]
    out = bench.overlap_by_name(targets, ranges)
    assert out["a"] == {"overlap": 80, "calls": 1, "duration": 100}
    assert out["b"] == {"overlap": 190, "calls": 2, "duration": 190}
    assert out["c"] == {"overlap": 0, "calls": 1, "duration": 300}  # ran only while the GPU was busy


def test_gap_histogram():
    gaps = [(0, 5), (10, 60), (100, 200), (300, 1300), (2000, 2100)]
    out = bench.gap_histogram(gaps)
    assert [g["range"] for g in out] == ["< 10 us", "10-100 us", "100-1000 us", ">= 1000 us"]
    assert [g["gaps"] for g in out] == [1, 1, 2, 1]
    assert [g["us"] for g in out] == [5, 50, 200, 1000]


def _x(cat, name, ts, dur, *, pid=1, tid=10, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def _host_trace() -> dict:
    """Two profiled steps with a known answer (us). Step 0 (0-1000): kernels 100-400 (two overlapping, stream 7)
    and 600-700 (stream 9), so idle 0-100, 400-600, 700-1000 (600 us); step 1 (2000-2500) fully busy."""
    k = "kernel"
    events = [
        _x("user_annotation", "bench_step_0", 0, 1000),
        _x("user_annotation", "bench_step_1", 2000, 500),
        _x(k, "k0", 100, 200, pid=0, tid=7, stream=7),
        _x(k, "k1", 250, 150, pid=0, tid=7, stream=7),
        _x(k, "k2", 600, 100, pid=0, tid=9, stream=9),
        _x(k, "k3", 2000, 500, pid=0, tid=7, stream=7),
        _x(k, "outside", 1500, 100, pid=0, tid=7, stream=7),  # in no window: ignored
        _x("gpu_user_annotation", "bcg_phase/forward", 0, 3000, pid=0, tid=7),  # GPU-side copy: not a phase
        _x("user_annotation", "bcg_phase/step_setup", 0, 50),
        _x("user_annotation", "bcg_phase/forward", 50, 450),
        _x("user_annotation", "bcg_phase/vision_forward", 60, 390),
        _x("user_annotation", "bcg_phase/backward", 500, 400),
        _x("user_annotation", "bcg_phase/vision_backward", 650, 150, tid=20),  # the autograd thread
        _x("user_annotation", "someone_elses_marker", 0, 1000),  # no bcg_phase/ prefix: not a phase
        _x("cpu_op", "aten::linear", 20, 100),
        _x("cpu_op", "aten::addmm", 30, 80),  # nested in linear
        _x("cpu_op", "aten::copy_", 420, 160),
        _x("cpu_op", "aten::copy_", 950, 30),
        _x("cpu_op", "autograd::engine::evaluate_function: MulBackward0", 700, 60, tid=20),
        _x("cpu_op", "aten::other_process", 0, 1000, pid=2),  # another process: ignored
        _x("cuda_runtime", "cudaLaunchKernel", 25, 3),
        _x("cuda_runtime", "cudaStreamSynchronize", 300, 120),
        _x("cuda_driver", "cuLaunchKernel", 430, 2),
    ]
    return {"traceEvents": events}


def test_host_time_breakdown_on_a_synthetic_trace():
    out = bench.host_time_breakdown(_host_trace(), top=2)
    assert out["steps"] == 2
    assert out["window_ms_per_step"] == pytest.approx(0.75)  # (1000 + 500) / 2 us
    assert out["idle_ms_per_step"] == pytest.approx(0.3)  # 600 / 2
    assert out["kernel_ms_per_step"] == pytest.approx(0.45)
    assert out["idle_fraction"] == pytest.approx(600 / 1500)
    idle = {k: v["idle_ms_per_step"] for k, v in out["by_phase"].items()}
    assert idle == pytest.approx(
        {
            "backward": 0.1,
            "vision_backward": 0.05,
            "vision_forward": 0.045,
            "forward": 0.03,
            "step_setup": 0.025,
            bench.UNMARKED: 0.05,
        }
    )
    assert next(iter(out["by_phase"])) == "backward"  # ordered by idle time
    wall = {k: v["wall_ms_per_step"] for k, v in out["by_phase"].items()}
    assert wall == pytest.approx(
        {
            "step_setup": 0.025,
            "forward": 0.03,
            "vision_forward": 0.195,
            "backward": 0.125,
            "vision_backward": 0.075,
            bench.UNMARKED: 0.3,  # 900-1000 of step 0 and all of step 1
        }
    )
    assert out["phase_markers"] == 5
    assert [r["name"] for r in out["top_cpu_ops"]] == ["aten::copy_", "aten::linear"]  # top=2
    assert out["top_cpu_ops"][0] == pytest.approx(
        {"name": "aten::copy_", "idle_ms_per_step": 0.095, "calls_per_step": 1.0, "cpu_ms_per_step": 0.095}
    )
    runtime = {r["name"]: r for r in bench.host_time_breakdown(_host_trace())["top_runtime"]}
    assert runtime["cudaStreamSynchronize"]["idle_ms_per_step"] == pytest.approx(0.01)  # 400-420 of its 120 us
    assert runtime["cudaLaunchKernel"]["idle_ms_per_step"] == pytest.approx(0.0015)
    assert runtime["cuLaunchKernel"]["idle_ms_per_step"] == pytest.approx(0.001)
    # Idle time under no op and no runtime call: 600 - (80 + 180 + 60 + 30) us, each overlap counted once although
    # the sync, the copy and the driver call overlap each other.
    assert out["idle_outside_ops_ms_per_step"] == pytest.approx(0.125)
    gaps = {g["range"]: g for g in out["idle_by_gap_length"]}
    assert gaps["100-1000 us"]["gaps_per_step"] == pytest.approx(1.5)
    assert gaps["100-1000 us"]["ms_per_step"] == pytest.approx(0.3)
    assert gaps["< 10 us"]["gaps_per_step"] == 0


def test_host_time_breakdown_needs_step_windows():
    with pytest.raises(RuntimeError, match="bench_step_"):
        bench.host_time_breakdown({"traceEvents": [_x("cpu_op", "aten::add", 0, 10)]})


# ------------------------------------------------------------------------------------------ phase markers (CPU)
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
        if e.get("cat") == "user_annotation" and name.startswith(bench.PHASE_PREFIX):
            out.setdefault(name[len(bench.PHASE_PREFIX) :], []).append((e["ts"], e["ts"] + e["dur"]))
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
    host = bench.host_time_breakdown(trace)
    walls = {k: v["wall_ms_per_step"] for k, v in host["by_phase"].items()}
    assert sum(walls.values()) == pytest.approx(host["window_ms_per_step"])
    assert host["idle_ms_per_step"] == pytest.approx(host["window_ms_per_step"])
    assert walls.get(bench.UNMARKED, 0.0) < 0.2 * host["window_ms_per_step"]
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
    assert bench.run_order(bench.VARIANTS) == ["eager", "upstream", "ours", "eager_repeat"]
    with pytest.raises(ValueError, match="unknown variants"):
        bench.run_order(["eager", "fast"])


def test_select_variants_adds_or_removes_the_control():
    assert bench.select_variants("eager,upstream,ours") == ["eager", "upstream", "ours", "eager_repeat"]
    assert bench.select_variants("ours,eager_repeat", control=False) == ["ours"]
    assert bench.select_variants(None, control=False) == ["eager", "upstream", "ours"]


def test_the_control_is_built_like_eager():
    cfg = bench.tiny_config()
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

    def fake_run_variant(shared, variant):
        calls.append(variant)
        rec = _fake_rec(variant, losses[variant])
        if variant != "eager":
            diffs = [abs(a - b) for a, b in zip(losses[variant], losses["eager"], strict=True)]
            rec.update(loss_abs_diff_per_step=diffs, loss_max_abs_diff_vs_eager=max(diffs))
        return rec

    monkeypatch.setattr(bench, "_run_variant", fake_run_variant)
    monkeypatch.setattr(bench, "make_batch", lambda cfg, images, seed, device="cuda": {"seed": seed})
    out = bench.run_config(
        bench.tiny_config(),
        world=None,
        measured_steps=2,
        warmup_steps=1,
        profile=False,
        profiler_sees_graph_kernels=None,
        variants=["ours", "upstream", "eager_repeat"],
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


def test_run_config_stops_when_eager_fails(monkeypatch):
    calls = []

    def fake_run_variant(shared, variant):
        calls.append(variant)
        return {"status": "failed", "error": "boom"}

    monkeypatch.setattr(bench, "_run_variant", fake_run_variant)
    monkeypatch.setattr(bench, "make_batch", lambda cfg, images, seed, device="cuda": {})
    out = bench.run_config(
        bench.tiny_config(), None, measured_steps=1, warmup_steps=0, profile=False, profiler_sees_graph_kernels=None
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
def test_split_of_the_full_matrix_over_two_gpus():
    groups = bench.split_configs(bench.full_configs(), 2)
    names = [[c.name for c in g] for g in groups]
    # The heaviest shares its GPU only with the cheapest small configuration; the two mid-weight ones are together.
    assert names == [
        ["small-mbs1-seq2048", "small-mbs2-seq4096"],
        ["tiny", "small-mbs2-seq2048", "small-mbs1-seq4096"],
    ]
    loads = [sum(bench.estimated_cost(c) for c in g) for g in groups]
    assert max(loads) / min(loads) < 1.1


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
def test_split_covers_every_config_once_and_balances(n):
    configs = bench.full_configs()
    groups = bench.split_configs(configs, n)
    assert len(groups) == min(n, len(configs))
    flat = [c.name for g in groups for c in g]
    assert sorted(flat) == sorted(c.name for c in configs)
    for g in groups:  # cheapest first within a group
        costs = [bench.estimated_cost(c) for c in g]
        assert costs == sorted(costs)
    heaviest = max(configs, key=bench.estimated_cost)
    if n >= 3:
        assert [heaviest.name] in [[c.name for c in g] for g in groups]  # alone on its GPU
    loads = [sum(bench.estimated_cost(c) for c in g) for g in groups]
    # Greedy longest-first: no group exceeds the average by more than one configuration's cost.
    assert max(loads) <= sum(loads) / len(loads) + max(bench.estimated_cost(c) for c in configs)
    assert bench.split_configs(configs, n) == groups  # deterministic


def test_split_rejects_zero_groups():
    with pytest.raises(ValueError):
        bench.split_configs(bench.full_configs(), 0)


def test_estimated_cost_grows_with_tokens():
    assert bench.tokens_per_step(bench.small_config(2, 4096)) == 8192
    costs = [bench.estimated_cost(c) for c in bench.full_configs()]
    assert costs == sorted(costs)  # the matrix is listed cheapest first


def test_resolve_devices():
    assert bench.resolve_devices(2, None, None) == ["0", "1"]
    assert bench.resolve_devices(2, None, "3,5,7") == ["3", "5"]
    assert bench.resolve_devices(None, "1, 0", "3,5") == ["1", "0"]
    assert bench.resolve_devices(None, ["2"], None) == ["2"]
    with pytest.raises(ValueError, match="lists only 1"):
        bench.resolve_devices(2, None, "4")
    with pytest.raises(ValueError, match="distinct"):
        bench.resolve_devices(None, "0,0", None)
    with pytest.raises(ValueError, match="positive"):
        bench.resolve_devices(0, None, None)


def test_child_argv_and_env(tmp_path):
    ns = bench._parse(["--gpus", "2", "--time-limit", "50", "--measured-steps", "7", "--no-profile", "--no-control"])
    argv = bench.child_argv(ns, ["tiny", "small-mbs1-seq2048"], tmp_path / "p0")
    assert argv[:3] == [sys.executable, "-m", "bridge_cudagraph.bench"]
    child = bench._parse(argv[3:])  # the child's own parser accepts it, and it runs in-process
    assert child.configs == "tiny,small-mbs1-seq2048" and child.out == str(tmp_path / "p0")
    assert child.measured_steps == 7 and child.warmup_steps == 3
    assert child.no_profile and child.no_control and child.variants == "eager,upstream,ours"
    assert child.gpus is None and child.devices is None and child.time_limit is None
    base = {"PATH": "/bin", "RANK": "3", "MASTER_PORT": "29500", "LOCAL_RANK": "3", bench.BENCH_ARGS_ENV: "--gpus 2"}
    env = bench.child_env(base, "1", 4321)
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["MASTER_PORT"] == "4321" and env["PATH"] == "/bin"
    assert "RANK" not in env and "LOCAL_RANK" not in env and bench.BENCH_ARGS_ENV not in env
    assert len(set(bench._free_ports(4))) == 4


def test_collect_children_marks_what_a_child_did_not_finish(tmp_path):
    ok = bench.Child(0, "0", ["tiny", "small-mbs2-seq4096"], tmp_path / "a", [], returncode=1)
    ok.out_dir.mkdir()
    ok.json_path.write_text(
        json.dumps(
            {
                "meta": {"gpu": "H200", "command": "child 0", "measured_steps": 30},
                "configs": [
                    {"name": "small-mbs2-seq4096", "status": "complete", "variants": {"ours": {"status": "failed"}}},
                    {"name": "tiny", "variants": {}},  # no status: an older bench, finished
                ],
            }
        )
    )
    ok.log_path.write_text("line\n" * 100 + "last line\n")
    dead = bench.Child(1, "1", ["small-mbs1-seq2048"], tmp_path / "b", [], timed_out=True, seconds=12.0)
    data = bench.collect_children(
        [ok, dead], order=["tiny", "small-mbs1-seq2048", "small-mbs2-seq4096"], meta={"command": "parent", "x": 1}
    )
    assert [c["name"] for c in data["configs"]] == ["tiny", "small-mbs1-seq2048", "small-mbs2-seq4096"]
    # rc 1 of child 0 came after its configurations finished (ours failed): they are not marked.
    assert data["configs"][2]["status"] == "complete" and data["configs"][0].get("status") is None
    missing = data["configs"][1]
    assert missing["status"] == "failed" and "timed out after 12 s" in missing["error"]
    assert missing["log_tail"] == ""  # child 1 left no log
    assert data["meta"]["command"] == "parent" and data["meta"]["gpu"] == "H200" and data["meta"]["x"] == 1
    assert [c["status"] for c in data["meta"]["children"]] == ["exit code 1", "timed out after 12 s"]
    assert bench.log_tail(ok.log_path, 2) == "line\nlast line"


# ------------------------------------------------------------------------------------------ several GPUs: processes
_FAKE_CHILD = textwrap.dedent(
    """
    import argparse, json, os, signal, sys, time
    p = argparse.ArgumentParser()
    p.add_argument("--out"); p.add_argument("--configs"); p.add_argument("--mode")
    a = p.parse_args()
    names = a.configs.split(",")
    os.makedirs(a.out, exist_ok=True)
    env = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "MASTER_PORT", "RANK")}

    def config(name, status):
        eager = {"status": "ok", "step_ms_median": 9.0}
        return {"name": name, "status": status, "env": env, "variants": {"eager": eager}}

    def write(configs):
        with open(os.path.join(a.out, "bench.json"), "w") as f:
            json.dump({"meta": {"gpu": "fake GPU", "command": "child"}, "configs": configs}, f)

    if a.mode == "ok":
        write([config(n, "complete") for n in names])
    elif a.mode == "fail":
        print("boom: CUDA error: an illegal memory access was encountered", flush=True)
        sys.exit(3)
    elif a.mode == "partial":  # finishes its first configuration, hangs in the second, ignores SIGTERM
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        write([config(names[0], "complete"), config(names[1], "running")])
        print("hanging in", names[1], flush=True)
        time.sleep(120)
    """
)


def test_run_on_gpus_merges_what_the_children_left(tmp_path):
    """Three fake children: one finishes, one crashes, one hangs (past the time limit, ignoring SIGTERM) after
    finishing one configuration and half of another. Nothing is lost that a child wrote."""
    script = tmp_path / "fake_child.py"
    script.write_text(_FAKE_CHILD)
    modes = {"small-mbs2-seq4096": "ok", "small-mbs1-seq2048": "fail", "tiny": "partial"}

    def make_argv(names, out_dir):
        return [
            sys.executable,
            str(script),
            "--out",
            str(out_dir),
            "--configs",
            ",".join(names),
            "--mode",
            modes[names[0]],
        ]

    env = {**os.environ, "RANK": "5", "MASTER_PORT": "1"}
    out = tmp_path / "bench"
    data, children = bench.run_on_gpus(
        bench.full_configs(),
        ["4", "5", "6"],
        out_dir=out,
        make_argv=make_argv,
        time_limit_s=3.0,
        command="bench --gpus 3",
        env=env,
        poll_s=0.05,
        grace_s=0.5,
    )
    assert [c.configs for c in children] == [
        ["small-mbs2-seq4096"],
        ["small-mbs1-seq2048", "small-mbs2-seq2048"],
        ["tiny", "small-mbs1-seq4096"],
    ]
    assert [c.status() for c in children][:2] == ["ok", "exit code 3"]
    assert children[2].timed_out and children[2].returncode is not None  # killed after SIGTERM was ignored
    assert data == json.loads((out / "bench.json").read_text())
    by_name = {c["name"]: c for c in data["configs"]}
    assert [c["name"] for c in data["configs"]] == [c.name for c in bench.full_configs()]
    assert by_name["small-mbs2-seq4096"]["status"] == "complete"
    assert by_name["tiny"]["status"] == "complete"
    for name in ("small-mbs1-seq2048", "small-mbs2-seq2048"):
        assert by_name[name]["status"] == "failed" and "exit code 3" in by_name[name]["error"]
        assert "boom: CUDA error" in by_name[name]["log_tail"]
    half = by_name["small-mbs1-seq4096"]
    assert half["status"] == "incomplete" and "timed out" in half["error"]
    assert half["variants"]["eager"]["step_ms_median"] == 9.0  # the variant it finished is kept
    assert "hanging in small-mbs1-seq4096" in half["log_tail"]
    # Each child saw only its GPU, a port of its own, and no launcher rank.
    envs = {c["name"]: c["env"] for c in data["configs"] if "env" in c}
    assert envs["small-mbs2-seq4096"]["CUDA_VISIBLE_DEVICES"] == "4"
    assert envs["tiny"]["CUDA_VISIBLE_DEVICES"] == "6"
    assert envs["tiny"]["MASTER_PORT"] != envs["small-mbs2-seq4096"]["MASTER_PORT"] != "1"
    assert all(e["RANK"] is None for e in envs.values())
    assert data["meta"]["command"] == "bench --gpus 3" and data["meta"]["gpu"] == "fake GPU"
    assert (out / "part0-gpu4" / "bench.log").exists()
    md = (out / "bench.md").read_text()
    assert "This configuration did not run" in md and "boom: CUDA error" in md
    assert "stopped before every variant finished" in md
    assert "Split over 3 processes, one per GPU: GPU 4: small-mbs2-seq4096 (ok" in md


def test_main_with_gpus_dispatches_to_children(monkeypatch, tmp_path):
    seen = {}

    def fake_run_on_gpus(configs, devices, *, out_dir, make_argv, time_limit_s, **kw):
        seen.update(configs=[c.name for c in configs], devices=devices, limit=time_limit_s, out=out_dir)
        seen["argv"] = make_argv(["tiny"], tmp_path / "p0")
        return {"configs": [{"name": "tiny", "status": "complete", "variants": {"ours": {"status": "ok"}}}]}, []

    monkeypatch.setattr(bench, "run_on_gpus", fake_run_on_gpus)
    monkeypatch.setattr(bench, "run", lambda *a, **k: pytest.fail("--gpus must not run in-process"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    rc = bench.main(None, ["--out", str(tmp_path), "--quick", "--gpus", "2", "--time-limit", "500", "--no-control"])
    assert rc == 0
    assert seen["configs"] == ["tiny", "small-mbs1-seq2048"] and seen["devices"] == ["2", "3"]
    assert seen["limit"] == 500 and seen["out"] == str(tmp_path)
    assert "--no-control" in seen["argv"] and "--gpus" not in seen["argv"]

    def unfinished(*a, **k):
        return {"configs": [{"name": "tiny", "status": "failed", "variants": {}}]}, []

    monkeypatch.setattr(bench, "run_on_gpus", unfinished)
    assert bench.main(None, ["--out", str(tmp_path), "--configs", "tiny", "--devices", "0"]) == 1


def test_time_limit_needs_children(tmp_path):
    with pytest.raises(SystemExit, match="--gpus"):
        bench.main(None, ["--out", str(tmp_path), "--configs", "tiny", "--time-limit", "5"])


def test_two_gpu_script_is_a_thin_wrapper():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "bench_two_gpus.sh")
    text = open(path).read()
    assert "-m bridge_cudagraph.bench" in text and "--gpus 2" in text and '"${1:-results/bench}"' in text
    assert os.access(path, os.X_OK)


def test_gpus_flag_parses():
    ns = bench._parse(["--gpus", "2", "--devices", "0,1", "--time-limit", "1.5"])
    assert isinstance(ns, argparse.Namespace) and ns.gpus == 2 and ns.devices == "0,1" and ns.time_limit == 1.5
