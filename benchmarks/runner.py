"""The benchmarks' variant runner: what every variant of a run goes through (build, helpers, warm-up, capture,
timed steps, profile, checks, teardown), as public functions that :mod:`benchmarks.useful_tokens` drives."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import math
import os
import platform
import re
import shlex
import statistics
import sys
import tempfile
import time
import traceback
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity

from benchmarks import leaks
from benchmarks.flops import mfu
from benchmarks.trace import (
    PHASE_PREFIX,
    STEP_MARK,
    busy_between_marks,
    host_time_breakdown,
    kernel_time_per_step,
    top_kernels,
)

logger = logging.getLogger("benchmarks.runner")

#: The seed of every variant's random state (the same initial weights and dropout for all).
SEED = 1234
#: A variant's outcome.
OK = "ok"
FAILED = "failed"


@dataclass
class StepData:
    """One form's GPU micro-batches, the fixed one, the step plan and the warm-up, measured and profiled counts."""

    world: Any
    batches: list[dict]
    fixed_batch: dict
    plan: list[list[int]]
    warmup_steps: int
    measured_steps: int
    profile_steps: int

    @property
    def measured(self) -> range:
        return range(self.warmup_steps, self.warmup_steps + self.measured_steps)

    @property
    def profiled(self) -> range:
        return range(self.measured.stop, self.measured.stop + self.profile_steps)


def environment() -> dict[str, Any]:
    """The GPU and the stack's versions (None for what is not there)."""
    from bridge_cudagraph.host.compat import installed_version

    return {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformer_engine": installed_version("transformer-engine"),
        "megatron_core": installed_version("megatron-core"),
        "megatron_bridge": installed_version("megatron-bridge"),
        "python": platform.python_version(),
    }


def command_line(module: str, argv: Sequence[str] | None = None) -> str:
    """``python -m MODULE ARGS`` as a user types it (``argv``, default this process's arguments), shell-quoted."""
    return " ".join([f"python -m {module}", *map(shlex.quote, sys.argv[1:] if argv is None else argv)])


def run_meta(command: str, date: str | None = None) -> dict[str, Any]:
    """The ``meta`` block every benchmark JSON opens with: command, date (default now), :func:`environment`."""
    return {"command": command, "date": date or time.strftime("%Y-%m-%d %H:%M:%S %Z"), **environment()}


def say(message: str) -> None:
    """A progress line on stdout, flushed."""
    print(f"[bench] {message}", flush=True)


def probe_profiler_sees_graph_kernels(kernels_per_graph: int = 16, replays: int = 3) -> dict:
    """Whether ``torch.profiler`` sees the kernels of a graph of ``kernels_per_graph`` replayed ``replays`` times."""
    x = torch.randn(1 << 16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = x.mul(1.0001).add_(1.0)  # warm the kernels up off the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x
        for _ in range(kernels_per_graph // 2):
            y = y.mul(1.0001).add_(1.0)
    torch.cuda.synchronize()

    def replay() -> None:
        for j in range(replays):
            with torch.profiler.record_function(f"{STEP_MARK}{j}"):
                graph.replay()
                torch.cuda.synchronize()

    counts = kernel_time_per_step(_trace_of(replay, [ProfilerActivity.CPU, ProfilerActivity.CUDA]), replays)["kernels"]
    expected = kernels_per_graph * replays
    return {"kernels_expected": expected, "kernels_seen": sum(counts), "sees_graph_kernels": sum(counts) >= expected}


def _trace_of(body: Callable[[], None], activities: list) -> dict:
    """The chrome trace of ``body`` under ``torch.profiler`` recording ``activities``, after :func:`_preroll`."""
    with tempfile.TemporaryDirectory() as tmp:
        with torch.profiler.profile(activities=activities) as prof:
            _preroll()
            body()
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            return json.load(f)


def _preroll(n: int = 64) -> None:
    """Tiny kernels at a profiling session's start, outside every step window: kineto's per-session CUPTI
    re-registration can corrupt the timestamps of a session's first kernel records."""
    t = torch.zeros(8, device="cuda")
    for _ in range(n):
        t.add_(1.0)
    torch.cuda.synchronize()


class VisionTimer:
    """CUDA events around every vision-encoder forward and backward while :attr:`active` and not capturing."""

    def __init__(self, model: Sequence[torch.nn.Module]) -> None:
        from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.vision_model import Qwen3VLVisionModel

        self.active = False
        self.records: list[dict[str, torch.cuda.Event]] = []
        self._current: dict | None = None
        self._handles = []
        for encoder in [m for chunk in model for m in chunk.modules() if isinstance(m, Qwen3VLVisionModel)]:
            self._handles.append(encoder.register_forward_pre_hook(self._pre))
            self._handles.append(encoder.register_forward_hook(self._post))
            embed = getattr(encoder, "patch_embed", None)
            if embed is not None:
                self._handles.append(embed.register_forward_hook(self._embedded))

    @staticmethod
    def _event() -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _pre(self, module, args) -> None:
        if self.active and not torch.cuda.is_current_stream_capturing():
            self._current = {"fwd0": self._event()}

    def _stamp_on_grad(self, tensor: Any, record: dict | None, key: str) -> None:
        """Record ``record[key]`` when the gradient reaches ``tensor`` (where one will)."""
        if record is None or not torch.is_tensor(tensor) or not tensor.requires_grad:
            return

        def stamp(_grad: torch.Tensor) -> None:
            record[key] = self._event()

        tensor.register_hook(stamp)

    def _embedded(self, module, args, output) -> None:
        self._stamp_on_grad(output, self._current, "bwd1")

    def _post(self, module, args, output) -> None:
        record, self._current = self._current, None
        if record is None:
            return
        record["fwd1"] = self._event()
        self._stamp_on_grad(output[0] if isinstance(output, tuple | list) else output, record, "bwd0")
        self.records.append(record)

    def collect(self) -> list[tuple[float, float | None]]:
        """``(forward ms, backward ms or None)`` per recorded call since the last collect (synchronizes)."""
        torch.cuda.synchronize()
        out = []
        for r in self.records:
            fwd = r["fwd0"].elapsed_time(r["fwd1"])
            bwd = r["bwd0"].elapsed_time(r["bwd1"]) if "bwd0" in r and "bwd1" in r else None
            out.append((fwd, bwd))
        self.records = []
        return out

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @staticmethod
    def summary(calls: Sequence[tuple[float, float | None]], steps: int) -> dict[str, Any]:
        """Median forward, backward and both ms per encoder call of ``calls`` (:meth:`collect`'s), calls per step."""
        fwd = [f for f, _ in calls]
        bwd = [b for _, b in calls if b is not None]
        both = [f + b for f, b in calls if b is not None]
        median = statistics.median
        return {
            "vision_calls": len(calls),
            "vision_fwd_ms": median(fwd) if fwd else None,
            "vision_bwd_ms": median(bwd) if bwd else None,
            "vision_ms": median(both) if both else (median(fwd) if fwd else None),
            "vision_microbatches_per_step": len(calls) / max(1, steps),
        }


def model_flops_utilisation(
    flops_per_step: Sequence[float],
    step_ms: Sequence[float],
    profiled_flops: Sequence[float],
    kernel_ms: float | None,
    peak: float | None,
) -> dict[str, Any]:
    """Model FLOPs, TFLOP/s and MFU of the measured steps, and MFU at the profiled kernel time; {} without FLOPs."""
    if not flops_per_step or not step_ms:
        return {}
    tflops = sum(flops_per_step) / (sum(step_ms) * 1e-3) / 1e12
    out = {
        "model_flops_per_step": statistics.fmean(flops_per_step),
        "model_tflops_per_s": tflops,
        "peak_tflops": peak,
        "mfu": tflops / peak if peak else None,
    }
    if profiled_flops and kernel_ms:
        out["mfu_at_kernel_time"] = mfu(statistics.fmean(profiled_flops), kernel_ms, peak)
    return out


def submodules_named(model: Sequence[torch.nn.Module], attribute: str) -> list[torch.nn.Module]:
    """Every distinct module some submodule of ``model`` holds as ``attribute``, whatever wraps the model."""
    found: dict[int, torch.nn.Module] = {}
    for chunk in model:
        for module in chunk.modules():
            child = getattr(module, attribute, None)
            if isinstance(child, torch.nn.Module):
                found.setdefault(id(child), child)
    return list(found.values())


class PhaseMarkers:
    """``record_function`` ranges ``bcg_phase/<phase>`` around a training step's phases (``step_setup``, ``forward``,
    ``backward``, ``optimizer_step``, ``step_end``; nested: ``vision_forward``, ``language_forward``,
    ``vision_backward``), by hooks and an ``optimizer.step`` wrapper, removed by :meth:`remove`."""

    def __init__(self, model: Sequence[torch.nn.Module], optimizer: Any = None) -> None:
        self._open: dict[str, Any] = {}
        self._current: str | None = None
        self._handles: list[Any] = []
        self._optimizer = optimizer
        for chunk in model:
            self._handles.append(chunk.register_forward_pre_hook(lambda *_: self.switch("forward")))
            self._handles.append(chunk.register_forward_hook(lambda *_: self.switch("backward")))
        for encoder in submodules_named(model, "vision_model"):
            self._handles.append(encoder.register_forward_pre_hook(lambda *_: self.open("vision_forward")))
            self._handles.append(encoder.register_forward_hook(self._vision_post))
            embed = getattr(encoder, "patch_embed", None)
            if isinstance(embed, torch.nn.Module):
                self._handles.append(embed.register_forward_hook(self._embedded))
        for language in submodules_named(model, "language_model"):
            self._handles.append(language.register_forward_pre_hook(lambda *_: self.open("language_forward")))
            self._handles.append(language.register_forward_hook(lambda *_: self.close("language_forward")))
        if optimizer is not None:
            self._wrap_step(optimizer)

    def open(self, phase: str) -> None:
        """Enter ``bcg_phase/<phase>`` (an open one of the same name is closed first)."""
        self.close(phase)
        marker = torch.profiler.record_function(PHASE_PREFIX + phase)
        marker.__enter__()
        self._open[phase] = marker

    def close(self, phase: str) -> None:
        """Exit ``bcg_phase/<phase>`` if it is open."""
        if (marker := self._open.pop(phase, None)) is not None:
            marker.__exit__(None, None, None)

    def switch(self, phase: str) -> None:
        """End the current main-thread phase and begin ``phase``."""
        if self._current is not None:
            self.close(self._current)
        self._current = phase
        self.open(phase)

    def start_step(self) -> None:
        """Call first thing in a profiled step."""
        self.switch("step_setup")

    def end_step(self) -> None:
        """Call last thing in a profiled step (after its synchronize): closes every range still open."""
        for phase in list(self._open):
            self.close(phase)
        self._current = None

    def remove(self) -> None:
        """Close every range, remove every hook and restore ``optimizer.step``."""
        self.end_step()
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._optimizer is not None:
            if self._had_step_attr:
                self._optimizer.step = self._old_step
            else:
                with contextlib.suppress(AttributeError):
                    del self._optimizer.step
            self._optimizer = None

    def _wrap_step(self, optimizer: Any) -> None:
        self._had_step_attr = "step" in vars(optimizer)
        self._old_step: Any = vars(optimizer).get("step")
        inner = optimizer.step

        def step(*args: Any, **kwargs: Any) -> Any:
            self.switch("optimizer_step")
            try:
                return inner(*args, **kwargs)
            finally:
                self.switch("step_end")

        optimizer.step = step

    def _vision_post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self.close("vision_forward")
        main = output[0] if isinstance(output, tuple | list) else output
        if torch.is_tensor(main) and main.requires_grad:
            main.register_hook(lambda _grad: self.open("vision_backward"))

    def _embedded(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if torch.is_tensor(output) and output.requires_grad:
            output.register_hook(lambda _grad: self.close("vision_backward"))


def _named_tensors(chunk: torch.nn.Module, *, remove_duplicate: bool = True) -> dict[str, torch.Tensor]:
    """A chunk's parameters and buffers by name, the tensors themselves (not ``state_dict``: Bridge's LoRA
    ``AdapterWrapper.state_dict`` drops the ``to_wrap.`` its ``load_state_dict`` expects)."""
    out: dict[str, torch.Tensor] = dict(chunk.named_parameters(remove_duplicate=remove_duplicate))
    out.update(chunk.named_buffers(remove_duplicate=remove_duplicate))
    return out


def snapshot(model) -> list[dict]:
    """Every parameter and buffer of the model chunks, on the CPU (pinned)."""

    def pinned(value: torch.Tensor) -> torch.Tensor:
        host = torch.empty(value.shape, dtype=value.dtype, device="cpu", pin_memory=value.is_cuda)
        return host.copy_(value.detach())

    return [{key: pinned(value) for key, value in _named_tensors(chunk).items()} for chunk in model]


#: Names only a graphs-on upstream Qwen3-VL has: they alias the language model's tensors.
_UPSTREAM_ALIAS_KEY = re.compile(r"^(module\.)*(decoder|rotary_pos_emb)(\.|$)")


def load_weights(model, state: list[dict], *, aliases_allowed: bool) -> None:
    """Copy ``state`` (:func:`snapshot`'s) into the model's tensors in place; raises where the parameters do not match
    both ways (save upstream's aliases) or a shape differs. A buffer made after the snapshot is left as it is."""
    for chunk, chunk_state in zip(model, state, strict=True):
        target = _named_tensors(chunk, remove_duplicate=False)
        params = {k for k, _ in chunk.named_parameters(remove_duplicate=False)}
        missing = [k for k in params - chunk_state.keys() if not (aliases_allowed and _UPSTREAM_ALIAS_KEY.match(k))]
        unexpected = sorted(chunk_state.keys() - target.keys())
        if missing or unexpected:
            raise RuntimeError(
                f"initial weights do not fit the model ({len(missing)} missing, {len(unexpected)} unexpected): "
                f"missing {sorted(missing)[:5]}, unexpected {unexpected[:5]}"
            )
        with torch.no_grad():
            for key, value in chunk_state.items():
                if target[key].shape != value.shape:
                    raise RuntimeError(
                        f"initial weights: {key} is {tuple(target[key].shape)}, not {tuple(value.shape)}"
                    )
                target[key].copy_(value)


def free_memory() -> None:
    """Collect garbage and give the caching allocator's free blocks back (after a synchronize)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def fixed_batch_check(model, batch: dict) -> tuple[torch.Tensor, float, dict]:
    """Per-token loss, grad norm and every trainable parameter's gradient (fp32, host) of one step on ``batch``."""
    from bridge_cudagraph.testing.parity import grad_norm, loss_and_grads

    loss, grads = loss_and_grads(model, batch, device="cpu")
    for chunk in model:
        chunk.zero_grad_buffer()
    return loss.cpu(), grad_norm(grads), grads


def non_finite_steps(values: Sequence[float] | None) -> list[int]:
    """The steps whose value is NaN, inf or missing."""
    return [i for i, v in enumerate(values or []) if v is None or not math.isfinite(v)]


class NonFiniteStepError(RuntimeError):
    """A variant's run had a NaN or infinite loss or grad norm."""


def require_finite(losses: Sequence[float], grad_norms: Sequence[float] | None = None) -> None:
    """Raise :class:`NonFiniteStepError` when any step's loss or grad norm is not finite."""
    series = (("loss", non_finite_steps(losses)), ("grad norm", non_finite_steps(grad_norms)))
    if bad := [f"{name} at steps {steps[:10]}" for name, steps in series if steps]:
        raise NonFiniteStepError("non-finite " + "; ".join(bad))


#: What :func:`capture_record` keeps of a helper's :class:`~bridge_cudagraph.capture.stats.CaptureStats`, in order.
CAPTURE_FIELDS = (
    "seconds graphs layers graph_memory_bytes per_budget per_budget_live budgets_captured budget_source late_captures "
    "above_captured param_grads_cloned param_grads_summed"
).split()


def capture_record(stats) -> dict[str, Any]:
    """What one helper's capture stats say about its capture and memory (mappings and the budgets copied)."""
    copied = {"per_budget": dict, "per_budget_live": dict, "budgets_captured": list}
    return {key: copied.get(key, lambda value: value)(getattr(stats, key)) for key in CAPTURE_FIELDS}


def growing(run_step: Callable[[int], float], helpers: list, record: dict) -> Callable[[int], float]:
    """``run_step`` with the budgets a ladder's pending micro-batches asked for captured untimed before each step;
    each growth in ``record["late_captures"]`` with the reserved and pool bytes before and after."""
    from bridge_cudagraph.capture.device_memory import held_reserved as reserved

    ladders = [h for h in helpers if hasattr(h, "capture_pending")]

    def run(i: int) -> float:
        for helper in ladders:
            if not helper.pending_budgets():
                continue
            pool_before, before = sum(helper.stats.per_budget.values()), reserved()
            if rungs := helper.capture_pending():
                record.setdefault("late_captures", []).append(
                    {
                        "step": i,
                        "submodule": helper.submodule,
                        "budgets": list(rungs),
                        "reserved_before_bytes": before,
                        "reserved_after_bytes": reserved(),
                        "pool_before_bytes": pool_before,
                        "pool_after_bytes": sum(helper.stats.per_budget.values()),
                    }
                )
        return run_step(i)

    return run


def capture(variant: str, helpers: list, *, upstream: bool = False) -> dict:
    """Capture every helper, measured; ``upstream``'s vision capture may fail without failing the variant."""
    from bridge_cudagraph.capture.device_memory import measure
    from bridge_cudagraph.capture.failure import abandon_capture
    from bridge_cudagraph.capture.stats import CaptureStats

    total = CaptureStats("all")
    errors: dict[str, str] = {}
    with measure(total):
        for helper in helpers:
            upstream_vision = upstream and getattr(helper, "bench_submodule", None) == "vision"
            try:
                helper.create_cudagraphs()
            except Exception as error:
                if not upstream_vision:
                    raise
                errors["vision"] = abandon_capture(helper.flattened_callables, helper.model, error, "upstream vision")
                gc.unfreeze()  # megatron-core's _start_capturing may have frozen the collector
                continue
            if upstream_vision:
                helper.cuda_graph_set_manual_hooks()  # as Bridge's train() does (a no-op upstream)
    missing = [
        type(h).__name__ for h in helpers if not h.graphs_created() and getattr(h, "bench_submodule", "") not in errors
    ]
    if missing:
        raise RuntimeError(f"{variant}: no graphs after create_cudagraphs() for {missing}")
    out: dict[str, Any] = {"capture_s": total.seconds, "graph_memory_bytes": total.graph_memory_bytes}
    if errors:
        out["capture_errors"] = errors
    if not upstream:
        out["capture"] = {h.submodule: capture_record(h.stats) for h in helpers}
        if vision := [h for h in helpers if h.submodule == "vision"]:
            out["vision_graph_memory_per_budget"] = dict(vision[0].stats.per_budget)
    return out


def profile(
    shared: StepData, run_step: Callable[[int], object], first_step: int, *, model: Any, optimizer: Any
) -> tuple[dict, dict]:
    """``(kernel time per step, host time breakdown or {"error": ...})`` of the profiled steps from ``first_step``."""
    n = shared.profile_steps
    markers = PhaseMarkers(model, optimizer)

    def steps() -> None:
        for j in range(n):
            with torch.profiler.record_function(f"{STEP_MARK}{j}"):
                markers.start_step()
                try:
                    run_step(first_step + j)
                    torch.cuda.synchronize()
                finally:
                    markers.end_step()

    try:
        trace = _trace_of(steps, [ProfilerActivity.CPU, ProfilerActivity.CUDA])
    finally:
        markers.remove()
    kernels = kernel_time_per_step(trace, n)
    kernels["top_kernels"] = top_kernels(trace, n)
    host: dict = {}  # {"error": ...} where the breakdown fails
    with recorded(host, "error"):
        host = host_time_breakdown(trace)
    return kernels, host


def profile_cuda_only(shared: StepData, run_step: Callable[[int], object], first_step: int) -> dict:
    """The profiled steps again, CUDA kernels only (:func:`~benchmarks.trace.busy_between_marks`): recording every
    CPU op stretches a graphed step of many small host calls, which :func:`profile`'s busy fraction reads as idle."""

    def steps() -> None:
        torch.cuda._sleep(1)
        for j in range(shared.profile_steps):
            run_step(first_step + j)
            torch.cuda.synchronize()
        torch.cuda._sleep(1)
        torch.cuda.synchronize()

    return busy_between_marks(_trace_of(steps, [ProfilerActivity.CUDA]), shared.profile_steps)


@contextlib.contextmanager
def recorded(rec: dict, key: str, *, limit: int = 500, what: str = "") -> Iterator[None]:
    """A block whose exception is recorded as ``rec[key]`` (and said after ``what``), never raised: a measurement
    aid is never a reason to lose the numbers."""
    try:
        yield
    except Exception as error:
        rec[key] = f"{type(error).__name__}: {error}"[:limit]
        if what:
            say(f"{what}: {rec[key]}")


def start_clean(rec: dict) -> float:
    """Free memory, reset the peaks, record what is allocated; the start's ``perf_counter``."""
    free_memory()
    torch.cuda.reset_peak_memory_stats()
    rec["allocated_at_start_bytes"] = torch.cuda.memory_allocated()
    rec["reserved_at_start_bytes"] = torch.cuda.memory_reserved()
    rec["outside_allocator_at_start_bytes"] = outside_allocator_bytes()
    return time.perf_counter()


def record_peaks(rec: dict) -> None:
    """Into ``rec``: the peaks since :func:`start_clean` and the memory outside the allocator now."""
    rec["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
    rec["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    rec["outside_allocator_bytes"] = outside_allocator_bytes()


def outside_allocator_bytes() -> int:
    """GPU memory in use beyond what PyTorch's caching allocator has reserved (other processes' included)."""
    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved()


def record_failure(rec: dict, error: Exception, what: str) -> None:
    """Mark ``rec`` failed with the error and its traceback's tail (call inside ``except``), and say so."""
    rec["status"] = FAILED
    rec["error"] = f"{type(error).__name__}: {error}"
    rec.update(error_origin(error))
    rec["traceback"] = traceback.format_exc()[-4000:]
    if torch.cuda.is_available():
        with recorded(rec, "outside_allocator_error"):
            rec["outside_allocator_bytes"] = outside_allocator_bytes()
    say(f"{what}: FAILED {rec['error'][:300]}")


#: Memory a deleted variant may leave allocated before who holds it is recorded.
LEAK_TOLERANCE_BYTES = 512 * 2**20


def check_freed(rec: dict, survivors: dict) -> None:
    """Record what the deleted variant left allocated: who holds its model or optimizer if they outlived
    :func:`teardown` (``survivors``, then freed); past :data:`LEAK_TOLERANCE_BYTES`, who holds the largest tensors."""
    rec["left_allocated_bytes"] = left = torch.cuda.memory_allocated()
    try:
        if survivors:
            target = survivors.get("optimizer") or survivors["model"][0]
            ignore = [survivors, *([survivors["model"]] if "model" in survivors else [])]
            rec["leak"] = {"survivors": sorted(survivors), "holders": leaks.holder_chains(target, ignore=ignore)}
        elif left - rec["allocated_at_start_bytes"] > LEAK_TOLERANCE_BYTES:
            rec["leak"] = leaks.leak_report()
    except Exception as error:
        rec["leak"] = {"error": f"{type(error).__name__}: {error}"[:500]}
    if survivors:
        with recorded(rec["leak"], "release_error"):
            released = leaks.release_training_memory(survivors.get("model"), survivors.get("optimizer"))
            rec["leak"]["released_bytes"] = released
        survivors.clear()
        free_memory()
        rec["left_allocated_bytes"] = torch.cuda.memory_allocated()
    if "leak" in rec:
        say(f"variant left {left / 2**30:.1f} GiB allocated: {json.dumps(rec['leak'])[:3000]}")


#: The share of the GPU's memory both models' first-run peaks must fit in for the paired phase to run.
PAIRED_MEMORY_FRACTION = 0.9


def paired_memory_check(results: dict[str, dict], total_bytes: int, names: Sequence[str]) -> str | None:
    """Why the paired phase cannot hold both models ``names`` at once (the sum of their first runs' peaks), or None."""
    recs = [results.get(name) or {} for name in names]
    if any(r.get("status") != "ok" or not r.get("peak_memory_bytes") for r in recs):
        return f"a first run of {' or '.join(names)} did not finish"
    start = min(int(r.get("allocated_at_start_bytes") or 0) for r in recs)
    need = sum(int(r["peak_memory_bytes"]) for r in recs) - start
    if need > PAIRED_MEMORY_FRACTION * total_bytes:
        return (
            f"both models at once need up to {need / 2**30:.1f} GiB (the sum of their peaks), over "
            f"{PAIRED_MEMORY_FRACTION:.0%} of the GPU's {total_bytes / 2**30:.1f} GiB"
        )
    return None


def gpu_memory_bytes() -> int:
    """The GPU's memory, or the cap :func:`cap_gpu_memory` set."""
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return min(total, GPU_MEMORY_CAP[0]) if GPU_MEMORY_CAP else total


#: The cap :func:`cap_gpu_memory` set (bytes), empty without one.
GPU_MEMORY_CAP: list[int] = []


def cap_gpu_memory(gib: float | None) -> float | None:
    """``--gpu-memory GIB``: cap this process's CUDA allocations as ``train --gpu-memory`` does; the fraction set."""
    if gib is None:
        return None
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    fraction = min(1.0, gib * 2**30 / total)
    torch.cuda.set_per_process_memory_fraction(fraction)
    GPU_MEMORY_CAP[:] = [int(fraction * total)]
    return fraction


def step_runner(
    shared: StepData, objs: dict, *, losses: list | None = None, grad_norms: list | None = None
) -> Callable[[int], float]:
    """``run(i)``: training step ``i`` of the plan, its wall ms; loss and grad norm appended to the lists given."""
    from bridge_cudagraph.testing.parity import train_steps

    model, optimizer = objs["model"], objs["optimizer"]

    def run(i: int) -> float:
        micro_batches = [shared.batches[k] for k in shared.plan[i]]
        norms = [] if grad_norms is None else grad_norms
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = train_steps(model, optimizer, [micro_batches], pg_collection=shared.world.language, grad_norms=norms)[0]
        torch.cuda.synchronize()
        ms = (time.perf_counter() - start) * 1e3
        if losses is not None:
            losses.append(loss)
        return ms

    return run


def break_ddp_cycles(model: Any) -> None:
    """Drop Megatron DDP's ``grad_accs``, whose hooks keep the DDP module alive out of the collector's sight."""
    for chunk in model or []:
        grad_accs = getattr(chunk, "grad_accs", None)
        if isinstance(grad_accs, list):
            grad_accs.clear()


def drop_kept_graphs(model: Any) -> None:
    """Drop every tensor with a ``grad_fn`` a module of ``model`` (or a plain object on one) keeps from a forward
    (the MoE dispatcher's ``probs``): its autograd graph holds DDP's hooks, which hold the model."""

    def drop(holder: Any) -> None:
        for name, value in list(vars(holder).items()):
            if isinstance(value, torch.Tensor) and value.grad_fn is not None:
                with contextlib.suppress(AttributeError, TypeError):  # a read-only slot
                    setattr(holder, name, None)

    for chunk in model or []:
        for module in chunk.modules():
            drop(module)
            for value in vars(module).values():
                if hasattr(value, "__dict__") and not isinstance(value, (torch.nn.Module, torch.Tensor, type)):
                    drop(value)


def teardown(objs: dict) -> dict:
    """Undo all a variant installed, drop its model and optimizer; returns what of them is still alive."""
    chunk_refs = [weakref.ref(chunk) for chunk in objs.get("model") or []]
    optimizer_ref = weakref.ref(objs["optimizer"]) if objs.get("optimizer") is not None else None
    if (timer := objs.get("timer")) is not None:
        timer.remove()
    for helper in objs.get("helpers") or []:  # first every decoder's class back
        try:
            if getattr(helper, "uninstall", None) is not None:
                helper.uninstall()
        except Exception as error:
            logger.warning("runner: uninstalling %s failed: %s", type(helper).__name__, error)
    for helper in objs.get("helpers") or []:
        try:
            if helper.graphs_created():
                helper.delete_cuda_graphs()
        except Exception as error:
            logger.warning("runner: deleting %s graphs failed: %s", type(helper).__name__, error)
    if objs.get("calculator"):
        from megatron.core.num_microbatches_calculator import destroy_num_microbatches_calculator

        destroy_num_microbatches_calculator()
    if objs.get("exits") is not None:
        objs["exits"].close()
    drop_kept_graphs(objs.get("model"))
    break_ddp_cycles(objs.get("model"))
    objs.clear()
    free_memory()
    chunks = [chunk for chunk in (ref() for ref in chunk_refs) if chunk is not None]
    survivors = {"model": chunks or None, "optimizer": optimizer_ref() if optimizer_ref is not None else None}
    return {key: value for key, value in survivors.items() if value is not None}


def ours_helpers(objs: dict, plan: Any) -> list:
    """This plugin's helpers of ``plan``, the step host installed first (undone by :func:`teardown`)."""
    from bridge_cudagraph.host import step as step_host

    model, optimizer, provider = objs["model"], objs["optimizer"], objs["provider"]
    if plan.cached_walks.grad_finalize:
        from bridge_cudagraph.testing.parity import prepare_finalize

        prepare_finalize(model)
    installed = step_host.install_planned(plan, model, optimizer)
    objs.setdefault("exits", contextlib.ExitStack()).callback(step_host.uninstall, installed)
    return provider.make_graph_helpers(model, plan=plan)


def upstream_helpers(objs: dict, world: Any, *, seq_length: int, micro_batch_size: int, num_microbatches: int) -> list:
    """megatron-core's TE graph helpers as Bridge's ``train()`` builds them, with the micro-batch calculator."""
    from megatron.core.num_microbatches_calculator import get_num_microbatches, init_num_microbatches_calculator
    from megatron.core.transformer.cuda_graphs import (
        TECudaGraphHelper,
        VisionTECudaGraphHelper,
        get_vision_cuda_graph_seq_length,
    )
    from megatron.core.utils import get_attr_wrapped_model, get_model_config

    from bridge_cudagraph.host import compat

    model, optimizer, provider = objs["model"], objs["optimizer"], objs["provider"]
    global_batch_size = micro_batch_size * num_microbatches
    init_num_microbatches_calculator(0, None, global_batch_size, micro_batch_size, world.language.dp.size())
    objs["calculator"] = True
    helpers = []
    model_config = get_model_config(model[0])
    if model_config.cuda_graph_impl == "transformer_engine":
        kwargs: dict[str, Any] = {"pg_collection": world.language} if compat.helper_accepts_pg_collection() else {}
        kwargs.update(model=model, config=model_config, seq_length=seq_length, micro_batch_size=micro_batch_size)
        helpers.append(TECudaGraphHelper(optimizers=[optimizer], **kwargs))
    if getattr(provider, "vision_cuda_graph_impl", None) == "transformer_engine":
        unwrapped = get_attr_wrapped_model(model[0], "vision_model", allow_none=True, return_model_obj=True)
        vision_model = getattr(unwrapped, "vision_model", None)
        if vision_model is not None and vision_model.config.cuda_graph_impl == "transformer_engine":
            config = vision_model.config
            pg = {"pg_collection": world.language} if compat.vision_helper_accepts_pg_collection() else {}
            helper = VisionTECudaGraphHelper(
                model=model,
                vision_config=config,
                vision_seq_length=get_vision_cuda_graph_seq_length(config),
                micro_batch_size=micro_batch_size,
                num_microbatches=get_num_microbatches(),
                **pg,
            )
            helper.bench_submodule = "vision"
            helpers.append(helper)
    return helpers


def error_origin(error: BaseException) -> dict[str, str]:
    """``cause``: the end of ``error``'s ``__cause__``/``__context__`` chain (a failed capture surfaces as the
    capture's end failing); ``where``: its innermost frame."""
    root, seen = error, {id(error)}
    while (nxt := root.__cause__ or root.__context__) is not None and id(nxt) not in seen:
        seen.add(id(nxt))
        root = nxt
    lines = str(root).strip().splitlines()
    out = {"cause": f"{type(root).__name__}: {lines[0] if lines else ''}"[:300]}
    frames = traceback.extract_tb(root.__traceback__)
    if frames:
        frame = frames[-1]
        path = frame.filename
        if "site-packages/" in path:
            path = path.split("site-packages/")[-1]
        else:
            with contextlib.suppress(ValueError):
                path = os.path.relpath(path)
        out["where"] = f"{path}:{frame.lineno} in {frame.name}"
    return out


def json_safe(value: Any) -> Any:
    """JSON-safe: NaN/inf floats become None, tuples lists, dict keys strings."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def write_json(path: Path, data: Any) -> None:
    """``data`` (:func:`json_safe`) to ``path`` through a temporary file and a rename: never half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(json_safe(data), indent=2))
    os.replace(tmp, path)
