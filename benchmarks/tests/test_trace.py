"""Profiler traces: GPU-idle intervals and their attribution to phases, CPU ops and runtime calls, on hand-built chrome
traces with known answers."""

from __future__ import annotations

import pytest

from benchmarks import trace as bt


def test_idle_intervals_are_the_window_minus_the_kernel_union():
    busy = [(100, 300), (250, 400), (600, 700), (-50, 20), (990, 1200)]
    assert bt.idle_intervals((0, 1000), busy) == [(20, 100), (400, 600), (700, 990)]
    assert bt.idle_intervals((0, 10), []) == [(0, 10)]
    assert bt.idle_intervals((0, 10), [(0, 10)]) == []
    assert bt.idle_intervals((0, 10), [(20, 30)]) == [(0, 10)]  # a kernel outside the window is no help


def test_merge_intervals():
    assert bt.merge_intervals([(5, 6), (0, 2), (1, 3), (3, 4), (7, 7)]) == [(0, 4), (5, 6)]


def test_outermost_keeps_only_top_level_ranges_per_thread():
    ranges = [
        (0, 10, "aten::linear", 1),
        (1, 9, "aten::addmm", 1),  # nested in linear
        (2, 3, "aten::view", 1),  # nested twice
        (9.5, 10.2, "aten::rounding", 1),  # starts inside linear, ends a hair after: nested
        (10, 12, "aten::add", 1),  # starts where linear ends: top level
        (1, 9, "aten::mul", 2),  # another thread: top level there
    ]
    assert [r[2] for r in bt.outermost(ranges)] == ["aten::linear", "aten::mul", "aten::add"]


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
    out = bt.attribute_innermost(targets, labelled)
    assert out == pytest.approx(
        {"setup": 50, "forward": 60, "vision": 90, "backward": 200, "vision_bwd": 100, bt.UNMARKED: 100}
    )
    assert sum(out.values()) == pytest.approx(600)
    assert bt.attribute_innermost([(0, 5)], [], default="x") == {"x": 5}


def test_overlap_by_name_counts_overlap_calls_and_duration():
    targets = [(0, 100), (400, 600), (700, 1000)]
    ranges = [(20, 120, "a", 1), (420, 580, "b", 1), (950, 980, "b", 1), (100, 400, "c", 1)]
    out = bt.overlap_by_name(targets, ranges)
    assert out["a"] == {"overlap": 80, "calls": 1, "duration": 100}
    assert out["b"] == {"overlap": 190, "calls": 2, "duration": 190}
    assert out["c"] == {"overlap": 0, "calls": 1, "duration": 300}  # ran only while the GPU was busy


def test_gap_histogram():
    gaps = [(0, 5), (10, 60), (100, 200), (300, 1300), (2000, 2100)]
    out = bt.gap_histogram(gaps)
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
    out = bt.host_time_breakdown(_host_trace(), top=2)
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
            bt.UNMARKED: 0.05,
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
            bt.UNMARKED: 0.3,  # 900-1000 of step 0 and all of step 1
        }
    )
    assert out["phase_markers"] == 5
    assert [r["name"] for r in out["top_cpu_ops"]] == ["aten::copy_", "aten::linear"]  # top=2
    assert out["top_cpu_ops"][0] == pytest.approx(
        {"name": "aten::copy_", "idle_ms_per_step": 0.095, "calls_per_step": 1.0, "cpu_ms_per_step": 0.095}
    )
    runtime = {r["name"]: r for r in bt.host_time_breakdown(_host_trace())["top_runtime"]}
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
        bt.host_time_breakdown({"traceEvents": [_x("cpu_op", "aten::add", 0, 10)]})


# ------------------------------------------------------------------------------------------ phase markers (CPU)


def test_top_kernels_and_longest_gaps_on_the_synthetic_trace():
    trace = _host_trace()
    # k3 500 us, k0 200, k1 150, k2 100 over 2 steps; the kernel outside every window is not counted
    top = bt.top_kernels(trace, 2, top=2)
    assert top == [["k3", pytest.approx(0.25), 0.5], ["k0", pytest.approx(0.1), 0.5]]
    out = bt.host_time_breakdown(trace, top=2)
    gaps = out["longest_gaps"]
    # Step 0's idle: 0-100, 400-600, 700-1000. The longest, 700-1000, starts inside vision_backward (the innermost
    # phase open at 700) under the autograd thread's MulBackward0, and its last microsecond is under no op; the
    # next, 400-600, starts in vision_forward under aten::copy_ (420-580 ends before the gap does).
    assert [g["ms"] for g in gaps] == pytest.approx([0.3, 0.2])
    assert gaps[0]["phase"] == "vision_backward" and gaps[0]["op_at_start"].endswith("MulBackward0")
    assert gaps[0]["op_at_end"] is None
    assert gaps[1]["phase"] == "vision_forward" and gaps[1]["op_at_end"] is None


def _kernel(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"stream": 7}}


def test_busy_between_marks_counts_the_kernel_union_between_the_two_markers():
    """Window: end of the first spin kernel (100) to the start of the last (1100), 1000 us over 2 steps; kernels
    inside: 200-400 and 300-500 (union 300 us) and 900-1000 (100 us); the one before the window and the clipped
    tail of 1050-1200 (50 us inside) count only inside it."""
    trace = {
        "traceEvents": [
            _kernel("at::cuda::(anonymous namespace)::spin_kernel(long)", 90, 10),
            _kernel("gemm", 10, 50),
            _kernel("gemm", 200, 200),
            _kernel("add", 300, 200),
            _kernel("add", 900, 100),
            _kernel("copy", 1050, 150),
            _kernel("at::cuda::(anonymous namespace)::spin_kernel(long)", 1100, 5),
            {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 0, "dur": 5000},
        ]
    }
    got = bt.busy_between_marks(trace, 2)
    assert got["busy"] == pytest.approx(450 / 1000)
    assert got["kernel_ms_per_step"] == pytest.approx(0.225)
    assert got["window_ms_per_step"] == pytest.approx(0.5)


def test_busy_between_marks_needs_both_markers():
    with pytest.raises(RuntimeError, match="markers"):
        bt.busy_between_marks({"traceEvents": [_kernel("spin_kernel", 0, 1), _kernel("gemm", 2, 3)]}, 1)


def _trace(kernels, windows):
    events = [{"ph": "X", "cat": "kernel", "ts": s, "dur": d, "args": {"stream": st}} for s, d, st in kernels]
    events += [
        {"ph": "X", "cat": "user_annotation", "name": f"bench_step_{j}", "ts": s, "dur": d}
        for j, (s, d) in enumerate(windows)
    ]
    events.append({"ph": "X", "cat": "gpu_user_annotation", "name": "bench_step_0", "ts": 0, "dur": 1e9})
    return {"traceEvents": events}


def test_kernel_time_per_step_unions_and_clips():
    kernels = [
        (100, 50, 7),  # step 0
        (120, 50, 7),  # overlaps the previous one: union 100..170 = 70
        (180, 10, 9),  # another stream
        (1e14, 5, 7),  # a corrupted off-clock record: ignored
        (1000, 400, 7),  # step 1
    ]
    trace = _trace(kernels, [(90, 200), (990, 1000)])
    out = bt.kernel_time_per_step(trace, 2)
    assert out["kernel_ms"] == pytest.approx([0.080, 0.400])
    assert out["kernels"] == [3, 1]
    assert out["compute_stream"] == 7
    assert out["compute_stream_ms"] == pytest.approx([0.100, 0.400])  # stream sum (overlap counted twice)
    assert out["window_ms"] == pytest.approx([0.2, 1.0])
    with pytest.raises(RuntimeError, match="ranges"):
        bt.kernel_time_per_step(trace, 3)


def test_union_length():
    assert bt.union_length([]) == 0
    assert bt.union_length([(0, 1), (0.5, 2), (3, 4), (3.5, 3.6)]) == pytest.approx(3.0)


def test_gpu_busy_summary_and_eager_fallback():
    profile = {"kernel_ms": [8.0, 9.0], "kernels": [100, 110], "compute_stream_ms": [8.0, 9.0], "window_ms": [12, 13]}
    by_key = {(0,): 10.0, (1,): 10.0}
    eager = bt.gpu_busy_summary(profile, by_key, [(0,), (1,)])
    assert eager["gpu_busy"] == pytest.approx(17 / 20) and eager["gpu_busy_source"] == "profiler"
    # the step time a kernel time is set against: the same micro-batches' unprofiled median, per step
    assert eager["step_ms_same_microbatches"] == pytest.approx(10.0) and eager["kernel_ms_per_step"] == 8.5
    unmatched = bt.gpu_busy_summary(profile, {(0,): 10.0}, [(0,), (1,)], fallback_step_ms=10.0)
    assert unmatched["step_ms_same_microbatches"] is None  # step (1,) never ran unprofiled
    assert eager["gpu_busy_in_profiled_steps"] == pytest.approx(17 / 25)
    graphed = {"kernel_ms": [0.5, 0.5], "kernels": [3, 3], "compute_stream_ms": [0.5, 0.5], "window_ms": [9, 9]}
    fast = {(0,): 9.0, (1,): 9.0}
    out = bt.gpu_busy_summary(graphed, fast, [(0,), (1,)], eager_profile=profile, graphed=True)
    assert out["gpu_busy_source"] == "eager_kernel_time"
    assert out["gpu_busy"] == pytest.approx(17 / 18)
    assert "eager's kernel time" in out["gpu_busy_note"]
    seen = bt.gpu_busy_summary(profile, fast, [(0,), (1,)], eager_profile=profile, graphed=True)
    assert seen["gpu_busy_source"] == "profiler" and seen["gpu_busy"] == pytest.approx(17 / 18)
    more = {**profile, "kernel_ms": [16.0, 17.0]}  # more work than eager (upstream's vision padding): kept
    padded = bt.gpu_busy_summary(more, by_key, [(0,), (1,)], eager_profile=profile, graphed=True)
    assert padded["gpu_busy_source"] == "profiler" and padded["gpu_busy"] == pytest.approx(33 / 20)
    assert "exceeds the unprofiled step time" in padded["gpu_busy_note"]
    blind = bt.gpu_busy_summary(
        profile, fast, [(0,), (1,)], eager_profile=profile, graphed=True, profiler_sees_graph_kernels=False
    )
    assert blind["gpu_busy_source"] == "eager_kernel_time"
    assert bt.gpu_busy_summary(None, by_key, [(0,)])["gpu_busy"] is None
