"""What a ``torch.profiler`` chrome trace of the profiled steps says (pure functions, no GPU): how busy the GPU was
(:func:`gpu_busy_summary`), and where the rest went (:func:`host_time_breakdown`). Trace times are us; per step, ms.
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
#: The kernel of ``torch.cuda._sleep`` (ATen's ``spin_kernel``): :func:`busy_between_marks`' window markers.
MARK_KERNEL = "spin_kernel"
#: Prefix of the ``record_function`` ranges :class:`benchmarks.runner.PhaseMarkers` opens around a step's phases.
PHASE_PREFIX = "bcg_phase/"
#: Idle time under no phase marker.
UNMARKED = "(unmarked)"
#: Chrome-trace categories of host-side CUDA API calls (kernel launches, graph launches, copies, syncs).
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
#: ``(start_us, end_us)``, with a name, and a host range's thread.
Span = tuple[float, float]
Labelled = tuple[float, float, str]
Range = tuple[float, float, str, Any]
#: Idle gap lengths (us) the report groups by: launch-latency gaps are a few us, stalls behind a sync are long.
GAP_EDGES_US = (10.0, 100.0, 1000.0)


def complete_events(trace: dict, *cats: str) -> Iterator[dict]:
    """The complete events of the categories ``cats`` (``kernel``, ``cpu_op``, ...) of a chrome trace."""
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() in cats:
            yield e


def _span(event: dict) -> Span:
    """``(start_us, end_us)`` of a complete event (a negative duration as none)."""
    ts = float(event.get("ts", 0.0))
    return ts, ts + max(0.0, float(event.get("dur", 0.0)))


def trace_kernels(trace: dict) -> list[tuple[float, float, Any]]:
    """``(start_us, end_us, stream)`` of every CUDA kernel in a chrome trace exported by ``torch.profiler``."""
    return [(*_span(e), (e.get("args") or {}).get("stream", e.get("tid"))) for e in complete_events(trace, "kernel")]


def _inside(t: float, windows: Iterable[Span]) -> bool:
    return any(lo <= t < hi for lo, hi in windows)


def top_kernels(trace: dict, n_steps: int, top: int = 12) -> list[list[Any]]:
    """The ``top`` kernels by GPU time in the profiled steps: ``[name (120 characters), ms, launches]`` per step."""
    windows = trace_windows(trace)
    totals: dict[str, list[float]] = {}
    for e in complete_events(trace, "kernel"):
        if _inside(float(e.get("ts", 0.0)), windows):
            entry = totals.setdefault(str(e.get("name", "?"))[:120], [0.0, 0.0])
            entry[0] += float(e.get("dur", 0.0)) / 1e3
            entry[1] += 1
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]
    return [[name, ms / max(1, n_steps), count / max(1, n_steps)] for name, (ms, count) in ranked]


def trace_windows(trace: dict, prefix: str = STEP_MARK) -> list[Span]:
    """The CPU ranges ``record_function(f"{prefix}{j}")`` marked, ordered by ``j``."""
    found = {}
    for e in complete_events(trace, "user_annotation"):
        name = str(e.get("name", ""))
        with contextlib.suppress(ValueError):
            if name.startswith(prefix):
                ts = float(e.get("ts", 0.0))
                found[int(name[len(prefix) :])] = (ts, ts + float(e.get("dur", 0.0)))
    return [found[j] for j in sorted(found)]


def union_length(intervals: Iterable[Span]) -> float:
    """Total length covered by ``(start, end)`` intervals (overlaps counted once)."""
    return sum((end - start for start, end in merge_intervals(intervals)), 0.0)


def kernel_time_per_step(trace: dict, n_steps: int) -> dict:
    """Per profiled step (ms): kernel union, kernel count, the busiest stream's time, the window's length."""
    kernels, windows = trace_kernels(trace), trace_windows(trace)
    if len(windows) != n_steps:
        raise RuntimeError(
            f"profiler trace has {len(windows)} '{STEP_MARK}*' ranges for {n_steps} profiled steps "
            f"({len(kernels)} kernels); cannot attribute kernel time to steps"
        )
    by_stream: dict[Any, float] = {}
    for start, end, stream in kernels:
        if _inside(start, windows):
            by_stream[stream] = by_stream.get(stream, 0.0) + (end - start)
    compute_stream = max(by_stream, key=by_stream.__getitem__) if by_stream else None
    union_ms, count, stream_ms = [], [], []
    for lo, hi in windows:
        inside = [(max(s, lo), min(e, hi), st) for s, e, st in kernels if s < hi and e > lo]
        union_ms.append(union_length((s, e) for s, e, _ in inside) / 1e3)
        count.append(sum(1 for s, _, _ in kernels if lo <= s < hi))
        stream_ms.append(sum(e - s for s, e, st in inside if st == compute_stream) / 1e3)
    window_ms = [(hi - lo) / 1e3 for lo, hi in windows]
    out = {"kernel_ms": union_ms, "kernels": count, "compute_stream": compute_stream, "compute_stream_ms": stream_ms}
    return {**out, "window_ms": window_ms, "streams": len(by_stream)}


def busy_between_marks(trace: dict, n_steps: int) -> dict:
    """GPU busy of a CUDA-only profile between its first and last :data:`MARK_KERNEL`, and per step (ms)."""
    marks: list[Span] = []
    kernels: list[Span] = []
    for e in complete_events(trace, "kernel"):
        (marks if MARK_KERNEL in str(e.get("name", "")) else kernels).append(_span(e))
    if len(marks) < 2:
        raise RuntimeError(f"CUDA-only profile has {len(marks)} '{MARK_KERNEL}' markers, needs 2")
    marks.sort()
    lo, hi = marks[0][1], marks[-1][0]
    if hi <= lo:
        raise RuntimeError("CUDA-only profile: the markers' window is empty")
    union = union_length((max(s, lo), min(e, hi)) for s, e in kernels if s < hi and e > lo)
    window = {"kernel_ms_per_step": union / 1e3 / n_steps, "window_ms_per_step": (hi - lo) / 1e3 / n_steps}
    return {"busy": union / (hi - lo), **window, "steps": n_steps}


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
    """One variant's GPU busy: its profiled kernel time over the same micro-batches' unprofiled wall time; eager's
    kernel time instead where the profiler misses graph kernels (probe) or sees under 70% of eager's."""
    if not profile:
        return {"gpu_busy": None, "gpu_busy_source": None}
    denominators = [step_ms_by_key.get(k, fallback_step_ms) for k in profiled_keys]
    present = [d for d in denominators if d is not None]
    if len(present) < len(denominators) or not denominators:
        return {"gpu_busy": None, "gpu_busy_source": None, "gpu_busy_note": "no unprofiled step time to divide by"}
    wall, kernel, n = sum(present), sum(profile["kernel_ms"]), len(denominators)
    # None where a profiled step's micro-batches never ran unprofiled: no step time of the same work to compare.
    same = wall / n if all(k in step_ms_by_key for k in profiled_keys) else None
    out: dict[str, Any] = {
        "kernel_ms_per_step": kernel / n,
        "step_ms_same_microbatches": same,
        "kernels_per_step": sum(profile["kernels"]) / n,
        "gpu_busy_profiler": kernel / wall,
        "gpu_busy_compute_stream": sum(profile["compute_stream_ms"]) / wall,
        "gpu_busy_in_profiled_steps": kernel / max(1e-9, sum(profile["window_ms"])),
        "streams_with_kernels": profile.get("streams"),
        "gpu_busy": kernel / wall,
        "gpu_busy_source": "profiler",
    }
    if graphed and eager_profile:
        eager_kernel = sum(eager_profile["kernel_ms"])
        out["kernel_ms_ratio_vs_eager"] = ratio = kernel / max(1e-9, eager_kernel)
        out["gpu_busy_from_eager_kernels"] = eager_kernel / wall
        reason = None
        if profiler_sees_graph_kernels is False:
            reason = "the profiler does not see kernels inside CUDA graph replays (probe)"
        elif ratio < 0.7:
            reason = (
                f"its profiled kernel time is only {ratio:.2f}x eager's for the same micro-batches (graph kernels "
                "missed or mis-timed by the profiler)"
            )
        if reason:
            out |= {"gpu_busy": out["gpu_busy_from_eager_kernels"], "gpu_busy_source": "eager_kernel_time"}
            out["gpu_busy_note"] = f"GPU busy estimated from eager's kernel time: {reason}."
    if out["gpu_busy_source"] == "profiler" and out["gpu_busy"] > 1.02:
        out["gpu_busy_note"] = (
            f"profiled kernel time exceeds the unprofiled step time ({out['gpu_busy']:.2f}): kernels ran slower "
            "under the profiler, or it mis-timed graph kernels"
        )
    return out


def idle_intervals(window: Span, busy: Iterable[Span]) -> list[Span]:
    """The parts of ``window`` no interval of ``busy`` covers, in order (a step's GPU-idle intervals, for kernels)."""
    lo, hi = window
    out: list[Span] = []
    cursor = lo
    for start, end in sorted((max(s, lo), min(e, hi)) for s, e in busy if e > lo and s < hi):
        if start > cursor:
            out.append((cursor, start))
        cursor = max(cursor, end)
    return [*out, (cursor, hi)] if cursor < hi else out


def merge_intervals(intervals: Iterable[Span]) -> list[Span]:
    """Overlapping or touching intervals joined, in order (:func:`union_length` sums their lengths)."""
    out: list[Span] = []
    for start, end in sorted((s, e) for s, e in intervals if e > s):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def outermost(ranges: Iterable[Range]) -> list[Range]:
    """The ranges ``(start, end, name, thread)`` starting inside no earlier kept range of their thread, in order."""
    by_thread: dict[Any, list[Range]] = {}
    for r in ranges:
        by_thread.setdefault(r[3], []).append(r)
    out = []
    for rs in by_thread.values():
        end = -math.inf
        for r in sorted(rs, key=lambda r: (r[0], -r[1])):
            if r[0] >= end:
                out.append(r)
                end = r[1]
    return sorted(out, key=lambda r: (r[0], -r[1]))


def attribute_innermost(
    targets: Sequence[Span], labelled: Sequence[Labelled], *, default: str = UNMARKED
) -> dict[str, float]:
    """The length of ``targets`` per label of the innermost ``labelled`` range covering it (latest start first)."""
    spans = [(s, e, name) for s, e, name in labelled if e > s]
    points = sorted({t for s, e in targets for t in (s, e)} | {t for s, e, _ in spans for t in (s, e)})
    starts: dict[float, list[int]] = {}
    ends: dict[float, list[int]] = {}
    for i, (s, e, _) in enumerate(spans):
        starts.setdefault(s, []).append(i)
        ends.setdefault(e, []).append(i)
    ordered = sorted((s, e) for s, e in targets if e > s)
    totals: dict[str, float] = {}
    active: dict[int, Labelled] = {}
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


def overlap_by_name(targets: Sequence[Span], ranges: Iterable[Range]) -> dict[str, dict[str, float]]:
    """Per range name: ``overlap`` with the disjoint ``targets``, ``calls`` and ``duration``."""
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


def gap_histogram(gaps: Sequence[Span], edges: Sequence[float] = GAP_EDGES_US) -> list[dict]:
    """Idle gaps grouped by length (``edges`` in us): their count and total (us) per group."""
    out = []
    for lo, hi in itertools.pairwise([0.0, *edges, math.inf]):
        inside = [e - s for s, e in gaps if lo <= e - s < hi]
        label = f"< {hi:g} us" if lo == 0 else f">= {lo:g} us" if hi == math.inf else f"{lo:g}-{hi:g} us"
        out.append({"range": label, "gaps": len(inside), "us": sum(inside)})
    return out


def trace_host_ranges(trace: dict, cats: Sequence[str], pid: Any = None) -> list[Range]:
    """``(start_us, end_us, name, thread)`` of the complete events of ``cats`` (of process ``pid``)."""
    return [
        (*_span(e), str(e.get("name", "?")), e.get("tid"))
        for e in complete_events(trace, *(c.lower() for c in cats))
        if pid is None or e.get("pid") == pid
    ]


def _top(stats: dict[str, dict[str, float]], n_steps: int, top: int) -> list[dict]:
    rows = sorted(stats.items(), key=lambda kv: (-kv[1]["overlap"], -kv[1]["duration"], kv[0]))[:top]
    per_step = (
        ("idle_ms_per_step", "overlap", 1e3),
        ("calls_per_step", "calls", 1),
        ("cpu_ms_per_step", "duration", 1e3),
    )
    return [{"name": name, **{key: s[field] / n_steps / unit for key, field, unit in per_step}} for name, s in rows]


def host_time_breakdown(trace: dict, *, prefix: str = PHASE_PREFIX, top: int = 10) -> dict:
    """GPU-idle time per step (ms) by innermost phase marker, CPU op and runtime call, gap length."""
    windows = trace_windows(trace)
    if not windows:
        raise RuntimeError(f"no '{STEP_MARK}*' ranges in the trace: no step to attribute host time to")
    n = len(windows)
    kernels = [(s, e) for s, e, _ in trace_kernels(trace)]
    idle = [gap for window in windows for gap in idle_intervals(window, kernels)]
    # The process of the step windows (the CPU side; kernels live under the GPU's pid).
    events = (e for e in trace.get("traceEvents", []) if str(e.get("cat", "")).lower() == "user_annotation")
    pid = next((e.get("pid") for e in events if str(e.get("name", "")).startswith(STEP_MARK)), None)
    marks = trace_host_ranges(trace, ("user_annotation",), pid)
    phases = [(s, e, name[len(prefix) :]) for s, e, name, _ in marks if name.startswith(prefix)]
    ops, runtime = (
        outermost(r for r in trace_host_ranges(trace, cats, pid) if _inside(r[0], windows))
        for cats in (("cpu_op",), RUNTIME_CATS)
    )
    # Ops of several threads, and runtime calls inside ops, overlap: their union, so no idle time counts twice.
    merged = merge_intervals((r[0], r[1]) for r in ops + runtime)
    covered = overlap_by_name(idle, [(s, e, "any", None) for s, e in merged]).get("any", {}).get("overlap", 0.0)
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
        "idle_outside_ops_ms_per_step": (idle_us - covered) / n / 1e3,
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


def longest_gaps(idle: list[Span], phases: list[Labelled], ops: list[Range], *, top: int = 10) -> list[dict]:
    """The ``top`` longest GPU-idle gaps: length (ms), phase and the outermost CPU op at their start and end."""

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
