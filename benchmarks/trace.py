"""What a ``torch.profiler`` chrome trace of the benchmark's profiled steps says: pure functions, no GPU needed.

How busy was the GPU (:func:`gpu_busy_summary`), and where did the rest go (each GPU-idle interval attributed to the
innermost phase marker open on the host, and to the CPU ops and CUDA runtime calls overlapping it:
:func:`host_time_breakdown`).
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

#: Name prefix of the ``record_function`` range the benchmark opens around each profiled step.
STEP_MARK = "bench_step_"


def complete_events(trace: dict, *cats: str) -> Iterator[dict]:
    """The complete events of the categories ``cats`` (``kernel``, ``cpu_op``, ...) of a chrome trace."""
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() in cats:
            yield e


def _span(event: dict) -> tuple[float, float]:
    """``(start_us, end_us)`` of a complete event (a negative duration as none)."""
    ts = float(event.get("ts", 0.0))
    return ts, ts + max(0.0, float(event.get("dur", 0.0)))


def trace_kernels(trace: dict) -> list[tuple[float, float, Any]]:
    """``(start_us, end_us, stream)`` of every CUDA kernel in a chrome trace exported by ``torch.profiler``."""
    return [(*_span(e), (e.get("args") or {}).get("stream", e.get("tid"))) for e in complete_events(trace, "kernel")]


def top_kernels(trace: dict, n_steps: int, top: int = 12) -> list[list[Any]]:
    """The kernels taking most GPU time in the profiled steps, most first: ``[name (120 characters), ms per step,
    launches per step]`` (which kernels a lever moved)."""
    windows = trace_windows(trace)
    totals: dict[str, list[float]] = {}
    for e in complete_events(trace, "kernel"):
        ts = float(e.get("ts", 0.0))
        if not any(lo <= ts < hi for lo, hi in windows):
            continue
        entry = totals.setdefault(str(e.get("name", "?"))[:120], [0.0, 0.0])
        entry[0] += float(e.get("dur", 0.0)) / 1e3
        entry[1] += 1
    steps = max(1, n_steps)
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]
    return [[name, ms / steps, count / steps] for name, (ms, count) in ranked]


def trace_windows(trace: dict, prefix: str = STEP_MARK) -> list[tuple[float, float]]:
    """The CPU ranges ``record_function(f"{prefix}{j}")`` marked, ordered by ``j``."""
    found = {}
    for e in complete_events(trace, "user_annotation"):
        name = str(e.get("name", ""))
        with contextlib.suppress(ValueError):
            if name.startswith(prefix):
                ts = float(e.get("ts", 0.0))
                found[int(name[len(prefix) :])] = (ts, ts + float(e.get("dur", 0.0)))
    return [found[j] for j in sorted(found)]


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by ``(start, end)`` intervals (overlaps counted once)."""
    return sum((end - start for start, end in merge_intervals(intervals)), 0.0)


def kernel_time_per_step(trace: dict, n_steps: int) -> dict:
    """Per profiled step: the union of kernel intervals in its window (ms), the kernel count, the busiest stream's
    kernel time (ms) and the window's length (ms); kernels outside every window (CUPTI's off-clock head records)
    ignored."""
    kernels = trace_kernels(trace)
    windows = trace_windows(trace)
    if len(windows) != n_steps:
        raise RuntimeError(
            f"profiler trace has {len(windows)} '{STEP_MARK}*' ranges for {n_steps} profiled steps "
            f"({len(kernels)} kernels); cannot attribute kernel time to steps"
        )
    by_stream: dict[Any, float] = {}
    for start, end, stream in kernels:
        if any(lo <= start < hi for lo, hi in windows):
            by_stream[stream] = by_stream.get(stream, 0.0) + (end - start)
    compute_stream = max(by_stream, key=by_stream.__getitem__) if by_stream else None
    union_ms, count, stream_ms, window_ms = [], [], [], []
    for lo, hi in windows:
        inside = [(max(s, lo), min(e, hi), st) for s, e, st in kernels if s < hi and e > lo]
        union_ms.append(union_length((s, e) for s, e, _ in inside) / 1e3)
        count.append(sum(1 for s, _, _ in kernels if lo <= s < hi))
        stream_ms.append(sum(e - s for s, e, st in inside if st == compute_stream) / 1e3)
        window_ms.append((hi - lo) / 1e3)
    return {
        "kernel_ms": union_ms,
        "kernels": count,
        "compute_stream": compute_stream,
        "compute_stream_ms": stream_ms,
        "window_ms": window_ms,
        "streams": len(by_stream),
    }


#: The kernel of ``torch.cuda._sleep`` (ATen's ``spin_kernel``): :func:`busy_between_marks`' window markers.
MARK_KERNEL = "spin_kernel"


def busy_between_marks(trace: dict, n_steps: int) -> dict:
    """GPU busy over the window between two marker kernels (:data:`MARK_KERNEL`, the first and last in ``trace``), for
    a CUDA-only profile without ``record_function`` step ranges: from the end of the first (launched after a
    synchronize, before the first step) to the start of the last (after the last step's synchronize), the steps' wall
    time on the GPU's clock. ``busy`` and per step ``kernel_ms`` and ``window_ms``."""
    marks: list[tuple[float, float]] = []
    kernels: list[tuple[float, float]] = []
    for e in complete_events(trace, "kernel"):
        (marks if MARK_KERNEL in str(e.get("name", "")) else kernels).append(_span(e))
    if len(marks) < 2:
        raise RuntimeError(f"CUDA-only profile has {len(marks)} '{MARK_KERNEL}' markers, needs 2")
    marks.sort()
    lo, hi = marks[0][1], marks[-1][0]
    if hi <= lo:
        raise RuntimeError("CUDA-only profile: the markers' window is empty")
    inside = [(max(s, lo), min(e, hi)) for s, e in kernels if s < hi and e > lo]
    union = union_length(inside)
    return {
        "busy": union / (hi - lo),
        "kernel_ms_per_step": union / 1e3 / n_steps,
        "window_ms_per_step": (hi - lo) / 1e3 / n_steps,
        "steps": n_steps,
    }


def gpu_busy_summary(
    profile: dict | None,
    step_ms_by_key: dict[Any, float],
    profiled_keys: Sequence[Any],
    *,
    eager_profile: dict | None = None,
    graphed: bool = False,
    profiler_sees_graph_kernels: bool | None = None,
    fallback_step_ms: float | None = None,
) -> dict:
    """The GPU-busy numbers of one variant: ``gpu_busy``, the profiled steps' kernel time (union over streams) over
    the unprofiled wall time of the same micro-batches; for a graphed variant whose graph kernels the profiler does not
    see (probe), or whose kernel time is under 70% of eager's (CUPTI's graph timing is unreliable on some CUDA
    versions), eager's kernel time instead (``gpu_busy_source="eager_kernel_time"``)."""
    if not profile:
        return {"gpu_busy": None, "gpu_busy_source": None}
    denominators = [step_ms_by_key.get(k, fallback_step_ms) for k in profiled_keys]
    present = [d for d in denominators if d is not None]
    if len(present) < len(denominators) or not denominators:
        return {"gpu_busy": None, "gpu_busy_source": None, "gpu_busy_note": "no unprofiled step time to divide by"}
    wall = sum(present)
    kernel = sum(profile["kernel_ms"])
    out: dict[str, Any] = {
        "kernel_ms_per_step": kernel / len(denominators),
        # None where a profiled step's micro-batches never ran unprofiled: no step time of the same work to compare.
        "step_ms_same_microbatches": wall / len(denominators)
        if all(k in step_ms_by_key for k in profiled_keys)
        else None,
        "kernels_per_step": sum(profile["kernels"]) / len(denominators),
        "gpu_busy_profiler": kernel / wall,
        "gpu_busy_compute_stream": sum(profile["compute_stream_ms"]) / wall,
        "gpu_busy_in_profiled_steps": kernel / max(1e-9, sum(profile["window_ms"])),
        "streams_with_kernels": profile.get("streams"),
        "gpu_busy": kernel / wall,
        "gpu_busy_source": "profiler",
    }
    if graphed and eager_profile:
        eager_kernel = sum(eager_profile["kernel_ms"])
        out["kernel_ms_ratio_vs_eager"] = kernel / max(1e-9, eager_kernel)
        out["gpu_busy_from_eager_kernels"] = eager_kernel / wall
        reason = None
        if profiler_sees_graph_kernels is False:
            reason = "the profiler does not see kernels inside CUDA graph replays (probe)"
        elif out["kernel_ms_ratio_vs_eager"] < 0.7:
            reason = (
                f"its profiled kernel time is only {out['kernel_ms_ratio_vs_eager']:.2f}x eager's for the same "
                "micro-batches (graph kernels missed or mis-timed by the profiler)"
            )
        if reason:
            out["gpu_busy"] = out["gpu_busy_from_eager_kernels"]
            out["gpu_busy_source"] = "eager_kernel_time"
            out["gpu_busy_note"] = f"GPU busy estimated from eager's kernel time: {reason}."
    if out["gpu_busy_source"] == "profiler" and out["gpu_busy"] > 1.02:
        out["gpu_busy_note"] = (
            f"profiled kernel time exceeds the unprofiled step time ({out['gpu_busy']:.2f}): kernels ran slower "
            "under the profiler, or it mis-timed graph kernels"
        )
    return out


#: Prefix of the ``record_function`` ranges :class:`PhaseMarkers` opens around a step's phases.
PHASE_PREFIX = "bcg_phase/"
#: Idle time under no phase marker.
UNMARKED = "(unmarked)"
#: Chrome-trace categories of host-side CUDA API calls (kernel launches, graph launches, copies, syncs).
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
#: Idle gap lengths (us) the report groups by: launch-latency gaps are a few us, stalls behind a sync are long.
GAP_EDGES_US = (10.0, 100.0, 1000.0)


def idle_intervals(window: tuple[float, float], busy: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of ``window`` no interval of ``busy`` covers, in order (a step's GPU-idle intervals, for kernels)."""
    lo, hi = window
    out: list[tuple[float, float]] = []
    cursor = lo
    for start, end in sorted((max(s, lo), min(e, hi)) for s, e in busy if e > lo and s < hi):
        if start > cursor:
            out.append((cursor, start))
        cursor = max(cursor, end)
    if cursor < hi:
        out.append((cursor, hi))
    return out


def merge_intervals(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Overlapping or touching intervals joined, in order (:func:`union_length` sums their lengths)."""
    out: list[tuple[float, float]] = []
    for start, end in sorted((s, e) for s, e in intervals if e > s):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def outermost(ranges: Iterable[tuple[float, float, str, Any]]) -> list[tuple[float, float, str, Any]]:
    """The ranges ``(start, end, name, thread)`` not nested in another of the same thread, in order: the profiler nests
    ops (``aten::linear`` holds ``aten::addmm``), which would count host time twice. A range starting inside an earlier
    one counts as nested even if it ends a rounding error after it."""
    by_thread: dict[Any, list[tuple[float, float, str, Any]]] = {}
    for r in ranges:
        by_thread.setdefault(r[3], []).append(r)
    out = []
    for rs in by_thread.values():
        rs.sort(key=lambda r: (r[0], -r[1]))
        end = -math.inf
        for r in rs:
            if r[0] >= end:
                out.append(r)
                end = r[1]
    return sorted(out, key=lambda r: (r[0], -r[1]))


def attribute_innermost(
    targets: Sequence[tuple[float, float]], labelled: Sequence[tuple[float, float, str]], *, default: str = UNMARKED
) -> dict[str, float]:
    """Split the length of ``targets`` (disjoint intervals, e.g. GPU idle) among labels: each instant goes to the
    innermost labelled range covering it (the latest start, ties the shorter, across threads: phase markers nest in
    time and the backward's live on the autograd thread), or to ``default``. The lengths add up to the targets'
    total."""
    spans = [(s, e, name) for s, e, name in labelled if e > s]
    points = sorted({t for s, e in targets for t in (s, e)} | {t for s, e, _ in spans for t in (s, e)})
    starts: dict[float, list[int]] = {}
    ends: dict[float, list[int]] = {}
    for i, (s, e, _) in enumerate(spans):
        starts.setdefault(s, []).append(i)
        ends.setdefault(e, []).append(i)
    ordered = sorted((s, e) for s, e in targets if e > s)
    totals: dict[str, float] = {}
    active: dict[int, tuple[float, float, str]] = {}
    t = 0
    for a, b in itertools.pairwise(points):
        for i in ends.get(a, ()):
            active.pop(i, None)
        for i in starts.get(a, ()):
            active[i] = spans[i]
        while t < len(ordered) and ordered[t][1] <= a:
            t += 1
        if t < len(ordered) and ordered[t][0] <= a and b <= ordered[t][1]:
            label = max(active.values(), key=lambda r: (r[0], -r[1]))[2] if active else default
            totals[label] = totals.get(label, 0.0) + (b - a)
    return totals


def overlap_by_name(
    targets: Sequence[tuple[float, float]], ranges: Iterable[tuple[float, float, str, Any]]
) -> dict[str, dict[str, float]]:
    """Per range name: ``overlap`` (its ranges' length inside the disjoint ``targets``), ``calls`` and ``duration``
    (their total length): which host calls ran while the GPU idled, and for how long."""
    ordered = sorted((s, e) for s, e in targets if e > s)
    ends = [e for _, e in ordered]
    out: dict[str, dict[str, float]] = {}
    for start, end, name, *_ in ranges:
        overlap = 0.0
        i = bisect.bisect_right(ends, start)
        while i < len(ordered) and ordered[i][0] < end:
            overlap += min(end, ordered[i][1]) - max(start, ordered[i][0])
            i += 1
        agg = out.setdefault(name, {"overlap": 0.0, "calls": 0, "duration": 0.0})
        agg["overlap"] += overlap
        agg["calls"] += 1
        agg["duration"] += end - start
    return out


def gap_histogram(gaps: Sequence[tuple[float, float]], edges: Sequence[float] = GAP_EDGES_US) -> list[dict]:
    """Idle gaps grouped by length (``edges`` in us): many short gaps mean launches cannot keep up with the GPU, a few
    long ones that the host stopped launching (a synchronisation, Python work between phases)."""
    bounds = [0.0, *edges, math.inf]
    out = []
    for lo, hi in itertools.pairwise(bounds):
        inside = [e - s for s, e in gaps if lo <= e - s < hi]
        label = f"< {hi:g} us" if lo == 0 else f">= {lo:g} us" if hi == math.inf else f"{lo:g}-{hi:g} us"
        out.append({"range": label, "gaps": len(inside), "us": sum(inside)})
    return out


def trace_host_ranges(trace: dict, cats: Sequence[str], pid: Any = None) -> list[tuple[float, float, str, Any]]:
    """``(start_us, end_us, name, thread)`` of the complete events of ``cats`` (of process ``pid``)."""
    return [
        (*_span(e), str(e.get("name", "?")), e.get("tid"))
        for e in complete_events(trace, *(c.lower() for c in cats))
        if pid is None or e.get("pid") == pid
    ]


def _window_pid(trace: dict, prefix: str = STEP_MARK) -> Any:
    """The process of the step windows (the CPU side; kernels live under the GPU's pid)."""
    events = trace.get("traceEvents", [])
    marks = (e for e in events if str(e.get("cat", "")).lower() == "user_annotation")
    return next((e.get("pid") for e in marks if str(e.get("name", "")).startswith(prefix)), None)


def _top(stats: dict[str, dict[str, float]], n_steps: int, top: int) -> list[dict]:
    rows = sorted(stats.items(), key=lambda kv: (-kv[1]["overlap"], -kv[1]["duration"], kv[0]))[:top]
    return [
        {
            "name": name,
            "idle_ms_per_step": s["overlap"] / n_steps / 1e3,
            "calls_per_step": s["calls"] / n_steps,
            "cpu_ms_per_step": s["duration"] / n_steps / 1e3,
        }
        for name, s in rows
    ]


def host_time_breakdown(trace: dict, *, prefix: str = PHASE_PREFIX, top: int = 10) -> dict:
    """Where the host time goes while the GPU idles, per step (ms) unless named: the GPU-idle intervals (each step
    window less the union of kernels) attributed to the innermost ``prefix`` phase marker (and each phase's wall time),
    the outermost CPU ops and CUDA runtime calls overlapping them most, the idle time no op overlaps, the idle gaps."""

    windows = trace_windows(trace)
    if not windows:
        raise RuntimeError(f"no '{STEP_MARK}*' ranges in the trace: no step to attribute host time to")
    n = len(windows)
    kernels = [(s, e) for s, e, _ in trace_kernels(trace)]
    idle = [gap for window in windows for gap in idle_intervals(window, kernels)]
    pid = _window_pid(trace)

    def in_windows(ranges: list[tuple[float, float, str, Any]]) -> list[tuple[float, float, str, Any]]:
        return [r for r in ranges if any(lo <= r[0] < hi for lo, hi in windows)]

    marks = trace_host_ranges(trace, ("user_annotation",), pid)
    phases = [(s, e, name[len(prefix) :]) for s, e, name, _ in marks if name.startswith(prefix)]
    ops = outermost(in_windows(trace_host_ranges(trace, ("cpu_op",), pid)))
    runtime = outermost(in_windows(trace_host_ranges(trace, RUNTIME_CATS, pid)))
    # Ops of several threads, and runtime calls inside ops, overlap: their union, so no idle time counts twice.
    covered = overlap_by_name(
        idle, [(s, e, "any", None) for s, e in merge_intervals((r[0], r[1]) for r in ops + runtime)]
    )
    idle_us = sum(e - s for s, e in idle)
    window_us = sum(hi - lo for lo, hi in windows)
    idle_by_phase = attribute_innermost(idle, phases)
    wall_by_phase = attribute_innermost(windows, phases)
    by_phase = {
        name: {"idle_ms_per_step": idle_by_phase.get(name, 0.0) / n / 1e3, "wall_ms_per_step": wall / n / 1e3}
        for name, wall in sorted(wall_by_phase.items(), key=lambda kv: -idle_by_phase.get(kv[0], 0.0))
    }
    return {
        "steps": n,
        "window_ms_per_step": window_us / n / 1e3,
        "kernel_ms_per_step": (window_us - idle_us) / n / 1e3,
        "idle_ms_per_step": idle_us / n / 1e3,
        "idle_fraction": idle_us / window_us if window_us > 0 else None,
        "idle_outside_ops_ms_per_step": (idle_us - covered.get("any", {}).get("overlap", 0.0)) / n / 1e3,
        "idle_by_gap_length": [
            {"range": g["range"], "gaps_per_step": g["gaps"] / n, "ms_per_step": g["us"] / n / 1e3}
            for g in gap_histogram(idle)
        ],
        "phase_prefix": prefix,
        "phase_markers": len(phases),
        "by_phase": by_phase,
        "top_cpu_ops": _top(overlap_by_name(idle, ops), n, top),
        "top_runtime": _top(overlap_by_name(idle, runtime), n, top),
        "longest_gaps": longest_gaps(idle, phases, ops, top=top),
    }


def longest_gaps(
    idle: list[tuple[float, float]],
    phases: list[tuple[float, float, str]],
    ops: list[tuple[float, float, str, Any]],
    *,
    top: int = 10,
) -> list[dict]:
    """The ``top`` longest GPU-idle gaps, each with its length (ms), the innermost phase open at its start, and the
    outermost CPU ops running at its start and its end (what the host did while the GPU waited, what ended the
    wait)."""

    def innermost_phase(t: float) -> str | None:
        open_ = [(s, e, name) for s, e, name in phases if s <= t < e]
        return max(open_, key=lambda r: r[0])[2] if open_ else None

    def op_at(t: float) -> str | None:
        names = [name for s, e, name, _ in ops if s <= t < e]
        return names[0][:100] if names else None

    return [
        {
            "ms": (end - start) / 1e3,
            "phase": innermost_phase(start),
            "op_at_start": op_at(start),
            "op_at_end": op_at(max(start, end - 1.0)),
        }
        for start, end in sorted(idle, key=lambda g: g[0] - g[1])[:top]
    ]
