"""What ``useful_tokens.json`` holds, the arithmetic of its numbers, and how it reads (``.md``, ``.png``, stdout).

No torch, no GPU: render again on any machine with ``python -m benchmarks.report DIR/useful_tokens.json``.

``useful_tokens.json`` holds ``meta`` (command, date, gpu, versions, ``config``: the run's shape and step counts),
``data`` (source, ``microbatches``: :meth:`MicroBatch.as_dict` each, the language and vision budgets, the plan),
``variants`` (name: record, :data:`ORDER`'s that ran, then :data:`CONTROL`; ``status`` ok | failed (+ ``error``) |
refused (+ ``reason``: the capture plan's)), ``paired`` (``status``, ``variants`` [A, B], ``step_ms``, ``ratios``:
A ms / B ms per pair, ``verdict``: :func:`paired_verdict`, ``counters``) and ``summary`` (:func:`summarize`). A
variant's record: ``form``, ``graphed``, ``useful_tokens_per_s``, ``speedup_vs_eager_packed``, ``step_ms`` with its
median, quartiles and IQR, ``useful_tokens_per_step``, ``real_tokens``, ``token_slots``, ``fill_fraction``,
``gpu_busy`` and ``kernel_ms_per_step`` (:func:`benchmarks.trace.gpu_busy_summary`), ``capture_s``,
``graph_memory_bytes``/``_gib``, ``capture`` and ``counters`` (per submodule), ``parity``, ``losses``, ``grad_norms``,
``peak_memory_bytes``, ``peak_reserved_bytes``, ``te_modules_fusing``, ``host_syncs``
(:func:`benchmarks.host_syncs.census`), ``seconds``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeGuard

from benchmarks.host_syncs import census_lines
from bridge_cudagraph.plan.budgets import PackedLayout
from bridge_cudagraph.testing.bounds import LOSS_BOUND  # torch-free: the report renders without torch

#: The compared variants, in run order: what runs when ``--variants`` is left out.
VARIANTS = ("eager_packed", "eager_padded", "upstream_padded", "ours_padded", "ours_packed")
#: eager_packed again, last: its difference from eager_packed is the run-to-run noise floor.
CONTROL = "eager_packed_repeat"
#: eager_padded again, where ``--variants`` names it: the padded loss curve's noise floor.
PADDED_CONTROL = "eager_padded_repeat"
#: Every variant in run order (the control last), its colour in the plot and what it is.
_VARIANT_ROWS = """\
eager_packed #4e79a7 Bridge's default: graphs off, in-batch packing
eager_padded #9e9e9e graphs off, every row padded to seq_length
upstream_padded #f28e2b upstream's TE graphs (megatron-core/Bridge helpers), padded
ours_padded #8cd17d bridge_cudagraph: BSHD language + vision graphs, padded
ours_padded_language #59a14f ours_padded with the language graphs only (vision graphs off)
eager_padded_repeat #c9c9c9 eager_padded again (the padded loss curve's noise floor)
ours_packed #59a14f bridge_cudagraph: packed (THD) language + vision graphs
eager_packed_repeat #a0cbe8 eager_packed again (run-to-run noise floor)
"""
_VARIANT_TABLE = [row.split(maxsplit=2) for row in _VARIANT_ROWS.splitlines()]
LABELS = {name: label for name, _, label in _VARIANT_TABLE}
COLORS = {name: color for name, color, _ in _VARIANT_TABLE}
#: Every variant in run order: a variant's parity reference runs before it; the control after all (and the paired).
ORDER = tuple(v for v in LABELS if v != CONTROL)
#: The reference every speed-up is against: Bridge's default (graphs off, in-batch packing).
BASELINE = "eager_packed"
#: The pair measured side by side, steps interleaved (ratios: first's step ms over the second's), unless ``--paired``.
PAIRED = ("eager_packed", "ours_packed")
PACKED, PADDED = "packed", "padded"
#: The graphs-off variant of the same form: the parity reference.
REFERENCE = {PACKED: "eager_packed", PADDED: "eager_padded"}
#: Every variant some variant's parity is taken against (each keeps its fixed-batch loss and profile).
REFERENCES = tuple(REFERENCE.values())
#: A variant's status where the capture plan refuses its graphs on this model (not built, not a failure).
REFUSED = "refused"
#: Our packed and padded graph variants.
PACKED_GRAPHED = tuple(v for v in ORDER if v.startswith("ours_packed"))
PADDED_GRAPHED = tuple(v for v in ORDER if v.startswith("ours_padded"))
#: The part of ours_padded that ``--variants`` may add: the fields it replaces of ours_padded's block, per submodule.
PADDED_PARTS: dict[str, dict[str, dict[str, Any]]] = {"ours_padded_language": {"vision": {"enabled": False}}}
GRAPHED = ("upstream_padded", *PADDED_GRAPHED, *PACKED_GRAPHED)
#: The variants whose one extra step runs under :func:`benchmarks.host_syncs.census` (eager_packed for comparison).
HOST_SYNC_VARIANTS = ("eager_packed", *PACKED_GRAPHED)
#: The micro-batch form each variant trains on, which its name says (every padded variant's has ``_padded``).
FORM = {v: PADDED if "_padded" in v else PACKED for v in LABELS}
#: The target for ours_packed over eager_packed (useful tokens/s): on the 2B shape, and per ``meta.config.model``.
TARGET_SPEEDUP = 1.3
TARGETS = {"tiny": TARGET_SPEEDUP, "small": TARGET_SPEEDUP, "peft8b": 1.15}
GIB = 2**30
#: Confidence of the paired phase's interval for the median ratio, and the bootstrap's resamples.
PAIRED_CONFIDENCE, BOOTSTRAP_RESAMPLES = 0.95, 4000
#: GPU busy under which the report says where the remaining host time goes.
GPU_BUSY_TARGET = 0.95
PHASE_KEYS = ("idle_ms_per_step", "wall_ms_per_step")
#: How the host-time phases (``bcg_phase/<name>``, :class:`benchmarks.runner.PhaseMarkers`) read in the report.
PHASE_LABELS = {
    "step_setup": "step set-up (train_steps' set-up, zero_grad, schedule) before the first forward",
    "forward": "forward outside the encoder and the language model's call (input embedding, image-token merge, "
    "mRoPE positions)",
    "vision_forward": "vision encoder forward",
    "language_forward": "language model forward (decoder, output layer, loss)",
    "backward": "loss reduction, backward outside the vision encoder, gradient finalisation",
    "vision_backward": "vision encoder backward (autograd thread)",
    "optimizer_step": "optimizer step (distributed Adam, grad norm, clipping)",
    "step_end": "after the optimizer step: loss and grad norm to the host, the step's synchronize",
    "(unmarked)": "outside every phase marker",
}
#: The memory targets of the packed ladder: ours_packed's peak reserved over eager_packed's, the language pools over
#: the largest captured rung's alone.
RESERVED_TARGET = 1.15
LADDER_TARGET = 1.1
#: The table's header, as it reads.
COLUMNS = tuple(
    "variant | useful tok/s | x vs eager_packed | step ms (median, IQR) | fill | GPU busy (in profiled steps) | "
    "kernel ms/step | step / kernel | graph GiB | peak GiB (allocated / reserved) | capture s | replays / eager "
    "fallbacks | parity: fixed micro-batch (max abs per-token loss diff; every parameter's gradient vs the eager "
    "floor)".split(" | ")
)


def reference_of(variant: str) -> str:
    """The variant ``variant``'s parity is taken against (itself for a reference of its form)."""
    return REFERENCE[FORM[variant]]


def target_of(data: Mapping[str, Any]) -> float:
    """The target of the run's model (``meta.config.model``); the 2B shape's where it is not recorded."""
    model = ((data.get("meta") or {}).get("config") or {}).get("model")
    return TARGETS.get(model, TARGET_SPEEDUP) if model is not None else TARGET_SPEEDUP


def _num(value: Any) -> float | None:
    """``value`` as a finite float, or None (missing, a bool, not a number, NaN or infinite)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _fmt(value: Any, spec: str, suffix: str = "") -> str:
    """``value`` in ``spec`` (then ``suffix``), or ``n/a`` where it is no finite number."""
    x = _num(value)
    return "n/a" if x is None else format(x, spec) + suffix


def fmt_ms(value: Any) -> str:
    """Milliseconds: one decimal from 10 ms up, two below."""
    return _fmt(value, ".1f" if abs(_num(value) or 0) >= 10 else ".2f")


def fmt_ratio(value: Any, suffix: str = "") -> str:
    """A ratio with two decimals (``2.51x``)."""
    return _fmt(value, ".2f", suffix)


def fmt_diff(value: Any) -> str:
    """A loss difference: ``0 (exact)``, ``3.2e-05``, or bold when over :data:`LOSS_BOUND`."""
    x = _num(value)
    return f"**{x:.1e}**" if x is not None and x > LOSS_BOUND else _fmt_rel(x)


def _fmt_rel(value: Any) -> str:
    """A relative difference: ``0 (exact)`` or ``3.0e-03`` (no loss bound applies to it)."""
    x = _num(value)
    return "n/a" if x is None else "0 (exact)" if x == 0 else f"{x:.1e}"


def fmt_count(value: Any) -> str:
    """A count per step: whole from 10 up (``2000``), one decimal below (``1.5``: an average over steps)."""
    return _fmt(value, ".0f" if abs(_num(value) or 0) >= 10 else ".1f")


def _fmt_peak(rec: Mapping[str, Any]) -> str:
    allocated, reserved = _num(rec.get("peak_memory_bytes")), _num(rec.get("peak_reserved_bytes"))
    return "n/a" if allocated is None or reserved is None else f"{allocated / GIB:.1f} / {reserved / GIB:.1f}"


#: What earlier variants may leave allocated before the memory section says a variant's peaks include it.
LEFTOVER_NOTED_BYTES = 512 * 2**20


def _gib(value: Any) -> float | None:
    """Bytes as GiB, None where not a number."""
    x = _num(value)
    return None if x is None else x / GIB


def _over(a: Any, b: Any) -> float | None:
    """``a / b`` where both are finite and non-zero, else None."""
    a, b = _num(a), _num(b)
    return a / b if a and b else None


def _line(text: Any) -> str:
    """The first line of ``text``, at most 120 characters."""
    return str(text).splitlines()[0][:120]


def _ok(rec: Any) -> TypeGuard[Mapping[str, Any]]:
    return bool(rec) and rec.get("status") == "ok"


def _table(header: str | Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A markdown table; ``header``: its cells, or one string of them joined by `` | ``."""
    header = header.split(" | ") if isinstance(header, str) else header
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _sentences(facts: Sequence[str]) -> list[str]:
    """``facts`` as one paragraph of sentences (each capitalised) and a blank line; nothing without facts."""
    return [". ".join(f[0].upper() + f[1:] for f in facts) + ".", ""] if facts else []


def _step_ms(rec: Mapping[str, Any]) -> float | None:
    """The unprofiled step of the profiled steps' micro-batches; a record from before the field: the median step."""
    return _num(rec.get("step_ms_same_microbatches" if "step_ms_same_microbatches" in rec else "step_ms_median"))


def step_over_kernel(variant: Mapping[str, Any]) -> float | None:
    """A variant's step time (:func:`_step_ms`) over its kernel time per step, None where either is missing; 1.00x
    is the limit a graph can approach (the GPU never waits for the host)."""
    return _over(_step_ms(variant), variant.get("kernel_ms_per_step"))


def kernel_time_missed(rec: Mapping[str, Any]) -> bool:
    """Whether the profiler missed the variant's graph kernels (too low a kernel time; its GPU busy is then estimated
    from the eager variant's kernel time, :func:`benchmarks.trace.gpu_busy_summary`)."""
    return rec.get("gpu_busy_source") not in (None, "profiler")


def block_bootstrap_ci(
    values: Sequence[float],
    confidence: float = PAIRED_CONFIDENCE,
    *,
    block: int | None = None,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float] | None:
    """Percentile interval of the median of ``values`` (in measurement order) by a moving-block bootstrap: runs of
    ``block`` consecutive pairs (default ``max(2, round(n ** (1/3)))``) are resampled, keeping the correlation of
    consecutive steps (the host, the allocator and the clocks drift). Seeded; None under 6 values."""
    n = len(values)
    if n < 6:
        return None
    b = block or max(2, round(n ** (1 / 3)))
    starts = range(n - b + 1)
    rng = random.Random(seed)
    medians = []
    for _ in range(resamples):
        sample: list[float] = []
        while len(sample) < n:
            i = rng.choice(starts)
            sample.extend(values[i : i + b])
        medians.append(statistics.median(sample[:n]))
    medians.sort()
    tail = (1 - confidence) / 2
    return medians[int(tail * (resamples - 1))], medians[math.ceil((1 - tail) * (resamples - 1))]


def sign_test_ci(values: Sequence[float], confidence: float = PAIRED_CONFIDENCE) -> tuple[float, float] | None:
    """The sign test's distribution-free interval for the median, valid for independent values:
    ``[r_(j), r_(n-j+1)]`` of the sorted values, ``j`` the largest with ``P(Binomial(n, 1/2) < j) <= (1 -
    confidence) / 2``. None with too few values for one (under 6 at 95%)."""
    r = sorted(float(x) for x in values)
    n = len(r)
    tail, j, cumulative = (1 - confidence) / 2, 0, 0.0
    while n and j < n:
        cumulative += math.comb(n, j) / 2**n  # P(X <= j)
        if cumulative > tail:
            break
        j += 1
    return None if j < 1 else (r[j - 1], r[n - j])


def paired_verdict(ratios: Sequence[float], confidence: float = PAIRED_CONFIDENCE) -> dict[str, Any]:
    """Judge per-pair step-time ratios (in measurement order; above 1: the second variant faster): ``median``, a
    ``confidence`` interval, the wider of :func:`sign_test_ci`'s and :func:`block_bootstrap_ci`'s (both recorded), and
    ``verdict``: "faster" (whole interval above 1), "slower", "within timing noise", or None under 6 pairs."""
    values = [float(x) for x in ratios]
    median = statistics.median(values) if values else None
    out: dict[str, Any] = {"pairs": len(values), "median": median, "ci": None, "verdict": None}
    out["ours_faster_pairs"] = sum(x > 1 for x in values)
    independent, blocks = sign_test_ci(values, confidence), block_bootstrap_ci(values, confidence)
    if independent is None or blocks is None:
        return out
    lo, hi = min(independent[0], blocks[0]), max(independent[1], blocks[1])
    verdict = "faster" if lo > 1 else "slower" if hi < 1 else "within timing noise"
    ci = {"ci_sign_test": list(independent), "ci_block_bootstrap": list(blocks), "confidence": confidence}
    return {**out, "ci": [lo, hi], **ci, "verdict": verdict}


def host_time_section(
    ours: Mapping[str, Any], eager: Mapping[str, Any], *, target: float = GPU_BUSY_TARGET
) -> list[str]:
    """The section on where the remaining host time goes, unless ours' GPU busy reaches ``target`` (or ours did not
    run): ours' GPU-idle time per profiled step by phase, and the CPU ops and CUDA runtime calls overlapping it most,
    beside eager's."""
    busy = _num(ours.get("gpu_busy"))
    if ours.get("status") != "ok" or busy is None or busy >= target:
        return []
    out = ["### Where the remaining host time goes", ""]
    host = ours.get("host_time") or {}
    if not host or host.get("error"):
        why = host.get("error") if host else "this run has no host-time profile (--profile-steps 0)"
        return [*out, f"Ours' GPU busy is {busy:.2f}, under the {target:g} target; {why}.", ""]
    eager = eager.get("host_time") or {}
    out.append(
        f"Ours' GPU busy is {busy:.2f}, under the {target:g} target. In its {host.get('steps', '?')} profiled steps "
        f"({fmt_ms(host.get('window_ms_per_step'))} ms each under the profiler, {fmt_ms(ours.get('step_ms_median'))} "
        f"ms unprofiled) the GPU ran no kernel for {fmt_ms(host.get('idle_ms_per_step'))} ms per step "
        f"({_fmt(host.get('idle_fraction'), '.0%')} of the step; eager: {fmt_ms(eager.get('idle_ms_per_step'))} ms). "
        "Idle time is the step window minus the union of kernel intervals on every stream; each idle microsecond is "
        "attributed to the innermost `bcg_phase/` marker open at that moment, and to the CPU ops and CUDA runtime "
        "calls running then (outermost per thread; ops of different threads may overlap, so those columns need not "
        "add up to the idle time)."
    )
    if kernel_time_missed(ours):
        out.append(
            "Caveat: ours' GPU-busy fraction was estimated from eager's kernel time because the profiler missed graph "
            "kernels, so the idle intervals below (from the kernels it saw) overstate the idle time."
        )
    phases = (host.get("by_phase") or {}, eager.get("by_phase") or {})
    rows = [
        [f"{phase}: {PHASE_LABELS[phase]}" if phase in PHASE_LABELS else phase]
        + [fmt_ms((p.get(phase) or {}).get(k)) for p in phases for k in PHASE_KEYS]
        for phase in [*phases[0], *(k for k in phases[1] if k not in phases[0])]
    ]
    header = "phase | ours GPU-idle ms/step | ours wall ms/step | eager GPU-idle ms | eager wall ms"
    out += ["", *_table(header, rows), ""]
    facts = []
    if (outside := _num(host.get("idle_outside_ops_ms_per_step"))) is not None:
        facts.append(
            f"{fmt_ms(outside)} ms of ours' idle time per step overlaps no CPU op and no CUDA runtime call on any "
            "thread (Python and framework code between ops)"
        )
    gaps = "; ".join(
        f"{g.get('range', '?')}: {fmt_count(g.get('gaps_per_step'))} gaps, {fmt_ms(g.get('ms_per_step'))} ms"
        for g in host.get("idle_by_gap_length") or []
    )
    if gaps:
        facts.append(f"ours' idle gaps by length, per step: {gaps}")
    out += _sentences(facts)
    for key, title in (("top_cpu_ops", "CPU op"), ("top_runtime", "CUDA runtime call")):
        eager_rows = {r.get("name"): r for r in eager.get(key) or []}
        rows = [
            [
                f"`{str(r.get('name')).replace('|', '/')}`",
                fmt_ms(r.get("idle_ms_per_step")),
                fmt_count(r.get("calls_per_step")),
                fmt_ms(r.get("cpu_ms_per_step")),
                fmt_ms(e.get("idle_ms_per_step")) if (e := eager_rows.get(r.get("name"))) else "-",
            ]
            for r in host.get(key) or []
        ]
        if rows:
            header = f"{title} | ours GPU-idle overlap ms/step | calls/step | CPU ms/step | eager GPU-idle overlap ms"
            out += [*_table(header, rows), ""]
    if host.get("top_cpu_ops") or host.get("top_runtime"):
        out += ["(-: not among eager's top entries.)", ""]
    return out


@dataclass(frozen=True)
class MicroBatch:
    """One collated micro-batch as the variants see it: the numbers, not the tensors. ``rows`` samples collated to
    ``width`` (a multiple of 128); ``real_tokens`` the samples' own (the attention mask), ``loss_tokens`` those that
    carry loss (the useful tokens); ``packed_tokens`` is ``T`` of the packed form (rows x the step's padded width, one
    THD segment per row), ``padded_tokens`` the padded form's slots (rows x seq_length); ``patches`` (the
    ``image_grid_thw`` products summed) and ``images`` (frames); ``tight_tokens`` ``T'`` of the packed form tightly
    packed (each row's extent rounded up to 16, :mod:`bridge_cudagraph.capture.tight`), 0 where unknown."""

    rows: int
    width: int
    real_tokens: int
    loss_tokens: int
    packed_tokens: int
    padded_tokens: int
    patches: int
    images: int
    tight_tokens: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


def token_slots(
    variant: str, mb: MicroBatch, budgets: Sequence[int] = (), max_sequences: int = 0, *, tight: bool = False
) -> int:
    """Token slots the language model computes for ``mb`` in ``variant``: padded forms rows x seq_length; eager packed
    ``T``; packed graphs the budget ``T`` replays in (:meth:`bridge_cudagraph.plan.budgets.PackedLayout.budget_for`;
    ``T`` where it falls back to eager), with ``tight`` (tight packing on) the budget of the kept tokens ``T'``."""
    if FORM[variant] == PADDED:
        return mb.padded_tokens
    if variant in PACKED_GRAPHED:
        tokens = mb.tight_tokens if tight and mb.tight_tokens else mb.packed_tokens
        return PackedLayout(tuple(budgets), max_sequences, 1).budget_for(tokens, mb.rows) or mb.packed_tokens
    return mb.packed_tokens


def per_step(plan: Sequence[Sequence[int]], steps: Sequence[int], values: Sequence[float]) -> list[float]:
    """For each step index of ``steps``, the sum of ``values`` over its micro-batches (``plan[step]``)."""
    return [sum(values[k] for k in plan[i]) for i in steps]


def fill_fraction(real_tokens: float, token_slots: float) -> float | None:
    """Real tokens over the token slots computed for them (None without slots)."""
    return real_tokens / token_slots if token_slots > 0 else None


def tokens_per_second(tokens_per_step: Sequence[float], step_ms: Sequence[float]) -> float | None:
    """All the steps' tokens over all their wall time (None unless every step is a finite positive time)."""
    if not step_ms or len(tokens_per_step) != len(step_ms) or any(not math.isfinite(t) or t <= 0 for t in step_ms):
        return None
    return sum(tokens_per_step) / (sum(step_ms) / 1e3)


def step_time_stats(step_ms: Sequence[float]) -> dict[str, float | None]:
    """Median, first and third quartile and inter-quartile range of the measured step times (ms)."""
    ms = sorted(float(x) for x in step_ms)
    if not ms:
        return {"step_ms_median": None, "step_ms_q1": None, "step_ms_q3": None, "step_ms_iqr": None}
    q1, _, q3 = statistics.quantiles(ms, n=4, method="inclusive") if len(ms) > 1 else (ms[0], ms[0], ms[0])
    return {"step_ms_median": statistics.median(ms), "step_ms_q1": q1, "step_ms_q3": q3, "step_ms_iqr": q3 - q1}


def variant_metrics(
    variant: str,
    micro: Sequence[MicroBatch],
    plan: Sequence[Sequence[int]],
    steps: Sequence[int],
    step_ms: Sequence[float],
    *,
    budgets: Sequence[int] = (),
    max_sequences: int = 0,
    tight: bool = False,
) -> dict[str, Any]:
    """The useful-token numbers of one variant's measured ``steps`` (plan indices) of ``step_ms`` each."""
    useful = per_step(plan, steps, [m.loss_tokens for m in micro])
    real = per_step(plan, steps, [m.real_tokens for m in micro])
    slots = per_step(plan, steps, [token_slots(variant, m, budgets, max_sequences, tight=tight) for m in micro])
    return {
        "useful_tokens_per_step": useful,
        "useful_tokens_per_s": tokens_per_second(useful, step_ms),
        "real_tokens": sum(real),
        "token_slots": sum(slots),
        "fill_fraction": fill_fraction(sum(real), sum(slots)),
        **step_time_stats(step_ms),
    }


def speedup(variant: Mapping[str, Any] | None, baseline: Mapping[str, Any] | None) -> float | None:
    """``variant``'s useful tokens/s over ``baseline``'s (None unless both finished and measured)."""
    if not _ok(variant) or not _ok(baseline):
        return None
    a, b = _num(variant.get("useful_tokens_per_s")), _num(baseline.get("useful_tokens_per_s"))
    return a / b if a is not None and b else None


def paired_names(paired: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The two variants a paired phase compared (``--paired``; files without the field: :data:`PAIRED`)."""
    return tuple((paired or {}).get("variants") or PAIRED)


def step_noise_floor(variants: Mapping[str, Any]) -> float | None:
    """How far eager_packed_repeat's median step lies from eager_packed's, relative (None unless both finished)."""
    base, control = variants.get(BASELINE), variants.get(CONTROL)
    if not _ok(base) or not _ok(control):
        return None
    a, b = _num(base.get("step_ms_median")), _num(control.get("step_ms_median"))
    return abs(b / a - 1.0) if a and b is not None else None


def summarize(data: Mapping[str, Any], *, target: float | None = None) -> dict[str, Any]:
    """ours_packed against eager_packed: separate runs, the paired phase (where it compared these two), and whether the
    target (default :func:`target_of`) is met, on the paired interval's lower end where the phase ran, else on the
    separate runs (None when neither measured it); and the noise floors of eager_packed_repeat's tokens/s and step."""
    variants = data.get("variants") or {}
    base = variants.get(BASELINE)
    target = target_of(data) if target is None else target
    out: dict[str, Any] = {"target": target, "separate": speedup(variants.get("ours_packed"), base)}
    paired = data.get("paired") or {}
    judged = None
    if paired.get("status") == "ok" and paired.get("ratios") and paired_names(paired) == PAIRED:
        judged = paired_verdict(paired["ratios"])
    out["paired"] = judged
    if judged and judged.get("ci"):
        out["met"], out["met_on"] = judged["ci"][0] >= target, "paired 95% interval's lower end"
    elif out["separate"] is not None:
        out["met"], out["met_on"] = out["separate"] >= target, "separate runs"
    else:
        out["met"], out["met_on"] = None, None
    control = speedup(variants.get(CONTROL), base)
    out["noise_floor"] = None if control is None else abs(control - 1.0)
    out["step_noise_floor"] = step_noise_floor(variants)
    # The padded graphs against both eager forms (on an MoE model, the form its padded recipes train).
    out["ours_padded"] = {ref: speedup(variants.get("ours_padded"), variants.get(ref)) for ref in REFERENCE.values()}
    return out


def finish(data: dict) -> dict:
    """Speed-ups vs eager_packed into every finished record, and the summary; returns ``data``."""
    variants = data.get("variants") or {}
    for rec in variants.values():
        if rec.get("status") == "ok":
            rec["speedup_vs_eager_packed"] = speedup(rec, variants.get(BASELINE))
    data["summary"] = summarize(data)
    return data


def _fmt_parity(name: str, rec: Mapping[str, Any]) -> str:
    parity = rec.get("parity") or {}
    if not parity:
        return "-"
    reference = parity.get("reference")
    if reference == name:
        return "reference"
    fixed = parity.get("fixed_batch") or {}
    if not fixed:
        return f"no reference ({reference} did not finish)"
    masked = (fixed.get("masked") or {}).get("loss_max_abs")
    text = f"{fmt_diff(fixed.get('loss_max_abs'))} vs {reference}"
    if masked is not None and _num(masked) != _num(fixed.get("loss_max_abs")):
        text += f" (loss tokens: {fmt_diff(masked)})"
    return text + "; " + fmt_grad_parity(fixed, control=name in (CONTROL, PADDED_CONTROL))


def fmt_grad_parity(fixed: Mapping[str, Any], *, control: bool = False) -> str:
    """A fixed-batch record's per-parameter gradient comparison as computed (never a default): the share bit-exact, the
    largest relative difference against the floor's, the verdict; "gradients not compared" without one. A
    ``control`` (a second eager model) is itself an eager-vs-eager distance: beyond the floor that the first model
    measured against itself, it says the floor is tighter than two eager models' spread, not that anything failed."""
    grads = fixed.get("grads")
    if not grads:
        return "gradients not compared"
    missing = len(grads.get("grad_missing") or [])
    exact = _fmt(grads.get("grad_exact_fraction"), ".0%")
    worst, floor = _fmt_rel(grads.get("grad_max_rel_l2")), _fmt_rel(fixed.get("floor_grad_max_rel_l2"))
    text = f"gradients {exact} bit-exact, max rel {worst} (floor {floor})"
    text += f", {missing} missing" if missing else ""
    if fixed.get("within_floor"):
        return text + ", within the floor"
    return text + (", two eager models' own spread: the floor is tighter" if control else ", BEYOND THE FLOOR")


def counter_problems(counters: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What a graphed variant's counters say against its graphs being the ones timed: a submodule without graphs,
    without a replay, or whose capture failed (it trained on eagerly); empty when every one captured and replayed."""
    out = []
    for sub, c in sorted(counters.items()):
        if c.get("failed"):
            out.append(f"{sub} capture failed ({_line(c['failed'])})")
        elif not c.get("graphs"):
            out.append(f"{sub} has no graphs")
        elif not c.get("replays"):
            out.append(f"{sub} never replayed")
    return out


def variant_row(name: str, rec: Mapping[str, Any] | None) -> list[str]:
    """One row of the table (a failed or missing variant says so)."""
    if not rec or rec.get("status") != "ok":
        if not rec:
            why = "not run"
        elif rec.get("status") == REFUSED:
            why = f"refused: {rec.get('reason') or '?'}"
        else:
            why = f"failed: {_line(rec.get('error') or 'failed')}"
        return [name, why.replace("|", "/"), *["n/a"] * (len(COLUMNS) - 2)]
    graphed, step_kernel = name in GRAPHED, fmt_ratio(step_over_kernel(rec), "x")
    # Where the profiler missed graph kernels, GPU busy is the estimate from eager's kernel time: both cells carry †.
    if kernel_time_missed(rec):
        busy = _fmt(rec.get("gpu_busy"), ".2f")
        busy, step_kernel = (busy + "†" if busy != "n/a" else busy), step_kernel + "†"
    else:
        busy = _fmt(rec.get("gpu_busy_in_profiled_steps"), ".2f")
    counters = sorted((rec.get("counters") or {}).items())
    return [
        name,
        _fmt(rec.get("useful_tokens_per_s"), ",.0f"),
        fmt_ratio(rec.get("speedup_vs_eager_packed"), "x"),
        f"{fmt_ms(rec.get('step_ms_median'))} (IQR {fmt_ms(rec.get('step_ms_iqr'))})",
        _fmt(rec.get("fill_fraction"), ".0%"),
        busy,
        fmt_ms(rec.get("kernel_ms_per_step")),
        step_kernel,
        _fmt(rec.get("graph_memory_gib"), ".1f") if graphed else "-",
        _fmt_peak(rec),
        fmt_ratio(rec.get("capture_s")) if graphed else "-",
        ", ".join(f"{sub} {c.get('replays', 0)} / {c.get('eager_fallbacks', 0)}" for sub, c in counters) or "-",
        _fmt_parity(name, rec),
    ]


def shown(data: Mapping[str, Any]) -> list[str]:
    """The table's rows in run order: every default variant, the others that ran, then the control."""
    present = data.get("variants") or {}
    return [*(v for v in ORDER if v in VARIANTS or v in present), *([CONTROL] if CONTROL in present else [])]


def _finished(data: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """``(name, record)`` of every finished variant, in :func:`shown`'s order."""
    variants = data.get("variants") or {}
    return [(n, variants[n]) for n in shown(data) if _ok(variants.get(n))]


def table(data: Mapping[str, Any]) -> list[str]:
    """The markdown table of every variant."""
    variants = data.get("variants") or {}
    return _table(COLUMNS, [variant_row(name, variants.get(name)) for name in shown(data)])


def memory_section(data: Mapping[str, Any]) -> list[str]:
    """``## Memory``: every variant's peaks against eager_packed's, ours_packed's ladders rung by rung (reserved
    growth, and of it kept alive), and :mod:`bridge_cudagraph.plan.memory`'s estimate against the measured pools."""
    variants = data.get("variants") or {}
    base_reserved = _num((variants.get(BASELINE) or {}).get("peak_reserved_bytes"))
    out = ["## Memory", ""]
    rows = [
        [
            name,
            *_fmt_peak(rec).split(" / "),
            fmt_ratio(_over(rec.get("peak_reserved_bytes"), base_reserved), "x"),
            _fmt(rec.get("graph_memory_gib"), ".1f") if name in GRAPHED else "-",
            _fmt(_gib(rec.get("outside_allocator_bytes")), ".1f"),
        ]
        for name, rec in _finished(data)
    ]
    if rows:
        header = (
            "variant | peak allocated GiB | peak reserved GiB | reserved vs eager_packed | graph GiB | "
            "outside the allocator GiB"
        )
        out += [*_table(header, rows), ""]
        out.append(
            "- *Outside the allocator*: the process's GPU memory beyond PyTorch's reserved pool after the measured "
            "steps (CUDA context, library handles and buffers). The peaks and `--gpu-memory` leave it out; on a card "
            "of the peak's size it comes on top."
        )
        for name, rec in _finished(data):
            if (start := _num(rec.get("allocated_at_start_bytes")) or 0) > LEFTOVER_NOTED_BYTES:
                own = (_num(rec.get("peak_memory_bytes")) or 0) - start
                own_reserved = (_num(rec.get("peak_reserved_bytes")) or 0) - (
                    _num(rec.get("reserved_at_start_bytes")) or start
                )
                out.append(
                    f"- {name} started with {start / GIB:.1f} GiB that earlier variants left allocated (in its peaks "
                    f"above); its own: {own / GIB:.1f} / {own_reserved / GIB:.1f} GiB allocated / reserved."
                )
    ours = variants.get("ours_packed") or {}
    if (ratio := _over(ours.get("peak_reserved_bytes"), base_reserved)) is not None:
        met = "met" if ratio <= RESERVED_TARGET else "not met"
        out.append(
            f"- **ours_packed's peak reserved** is {ratio:.2f}x eager_packed's (target at most {RESERVED_TARGET}x: "
            f"**{met}**)."
        )
    for submodule, rec in sorted((ours.get("capture") or {}).items()):
        per_budget = {int(k): int(v) for k, v in (rec.get("per_budget") or {}).items()}
        live = {int(k): int(v) for k, v in (rec.get("per_budget_live") or {}).items()}
        captured = rec.get("budgets_captured") or sorted(per_budget)
        if not per_budget:
            continue
        top, total = max(per_budget), sum(per_budget.values())
        ratio = total / per_budget[top] if per_budget[top] else float("nan")
        met = "met" if ratio <= LADDER_TARGET else "not met"
        # ``rec`` is the helper's stats at the capture; rungs captured after it are in ours["late_captures"].
        late = sum(
            len(g.get("budgets") or []) for g in ours.get("late_captures") or [] if g.get("submodule") == submodule
        )
        out.append(
            f"- **{submodule} ladder**: budgets {list(captured)} captured "
            f"(up to {rec.get('budget_source') or 'n/a'}); "
            f"their pools take {total / GIB:.2f} GiB, {ratio:.2f}x the largest rung alone "
            f"({per_budget[top] / GIB:.2f} GiB; target at most {LADDER_TARGET}x: **{met}**); "
            f"{max(late, rec.get('late_captures', 0))} rungs captured later for larger micro-batches (each ran "
            "eagerly until then: the eager fallbacks of the table above)."
        )
        cells = [
            [str(b), f"{per_budget[b] / 2**20:,.0f}", f"{live.get(b, 0) / 2**20:,.0f}"]
            for b in sorted(per_budget, reverse=True)
        ]
        out += ["", *_table((f"{submodule} budget", "reserved growth MiB", "of it kept alive MiB"), cells), ""]
    for submodule, est in sorted((ours.get("memory_estimate") or {}).items()):
        ratio = _num(est.get("measured_over_estimate"))
        out.append(
            f"- **{submodule} estimate** (bridge_cudagraph/plan/memory.py) at the captured top {est.get('top')}: "
            f"{est.get('estimate_bytes', 0) / GIB:.2f} GiB, measured {est.get('measured_bytes', 0) / GIB:.2f} GiB "
            f"({fmt_ratio(ratio, 'x')} of the estimate; within 20%: "
            f"**{'yes' if ratio and abs(ratio - 1) <= 0.2 else 'no'}**)."
        )
    out += [
        f"- before step {g.get('step')}: {g.get('submodule')} budgets {g.get('budgets')} captured."
        for g in ours.get("late_captures") or []
    ]
    cap = ((data.get("meta") or {}).get("config") or {}).get("gpu_memory_cap_gib")
    if cap:
        out.append(f"- The process was capped at {cap:g} GiB (`--gpu-memory`, torch's per-process memory fraction).")
    return [*out, ""]


def encoder_and_mfu_section(data: Mapping[str, Any]) -> list[str]:
    """``## Vision encoder and MFU``: each variant's encoder time per micro-batch (CUDA events, measured steps) and for
    padded rows the MFU of the measured steps and at the profiled steps' kernel time."""
    rows = [
        [name, *(fmt_ms(rec.get(k)) for k in ("vision_fwd_ms", "vision_bwd_ms", "vision_ms"))]
        + [fmt_ratio(rec.get("vision_microbatches_per_step"))]
        + [_fmt(rec.get(k), ".1%") if k in rec else "-" for k in ("mfu", "mfu_at_kernel_time")]
        for name, rec in _finished(data)
        if rec.get("vision_calls") is not None
    ]
    if not rows:
        return []
    header = (
        "variant | vision fwd ms/mb | vision bwd ms/mb | vision ms/mb | encoder calls/step | MFU | MFU at kernel time"
    )
    note = "(MFU: padded rows only, every position counted, dense BF16 peak of `benchmarks/flops.py`; -: not taken.)"
    return ["## Vision encoder and MFU", "", *_table(header, rows), "", note, ""]


def host_syncs_section(data: Mapping[str, Any]) -> list[str]:
    """``## Host waits on the GPU``: per variant of :data:`HOST_SYNC_VARIANTS` that recorded a census, its waits in
    one training step and the sites that ask for most of them (:func:`benchmarks.host_syncs.census_lines`)."""
    variants = data.get("variants") or {}
    lines = census_lines(variants, [n for n in shown(data) if n in HOST_SYNC_VARIANTS])
    errors = [
        f"- {n}: census failed: {variants[n]['host_syncs_error']}"
        for n in shown(data)
        if (variants.get(n) or {}).get("host_syncs_error")
    ]
    if not lines and not errors:
        return []
    return ["## Host waits on the GPU (one training step)", "", *lines, *errors, ""]


def _fmt_paired(paired: Mapping[str, Any] | None) -> str:
    """The paired phase in one clause: its pair's median per-pair ratio (first's step ms over second's: the
    second's useful-tokens/s ratio), its interval and verdict, or why it did not run."""
    if not paired:
        return "paired phase not run"
    if paired.get("status") == "skipped":
        return f"paired phase skipped: {paired.get('reason', '?')}"
    if paired.get("status") != "ok":
        return f"paired phase failed: {str(paired.get('error', '?'))[:200]}"
    judged = paired_verdict(paired.get("ratios") or [])
    if judged["ci"] is None:
        return f"paired {fmt_ratio(judged['median'], 'x')} over {judged['pairs']} pairs (too few for an interval)"
    lo, hi = judged["ci"]
    first, second = paired_names(paired)
    peak, reserved = _num(paired.get("peak_memory_bytes")), _num(paired.get("peak_reserved_bytes"))
    memory = ""
    if peak is not None:
        both = f"{peak / GIB:.1f}" if reserved is None else f"{peak / GIB:.1f} / {reserved / GIB:.1f}"
        memory = f"; both models' peak {both} GiB allocated{'' if reserved is None else ' / reserved'}"
    return (
        f"paired (both models alive, steps interleaved) median per-pair ratio {first} ms / {second} ms "
        f"{judged['median']:.3f}x, within-call 95% interval [{lo:.3f}, {hi:.3f}] over {judged['pairs']} pairs "
        f"({judged['ours_faster_pairs']} with {second} faster): {judged['verdict']}{memory}"
    )


def _headline(data: Mapping[str, Any]) -> tuple[dict[str, Any], Mapping[str, Any] | None, str | None, str | None]:
    """The summary (recorded, else :func:`summarize`), the paired record, its clause where it paired :data:`PAIRED`
    (else None), ours_padded's speed-ups (``1.12x vs eager_packed, 1.40x vs eager_padded``; None where neither ran)."""
    summary, paired = data.get("summary") or summarize(data), data.get("paired")
    clause = _fmt_paired(paired) if paired_names(paired) == PAIRED else None
    padded = summary.get("ours_padded") or {}
    if all(x is None for x in padded.values()):
        return summary, paired, clause, None
    return summary, paired, clause, ", ".join(f"{fmt_ratio(x, 'x')} vs {ref}" for ref, x in padded.items())


def _verdict_lines(data: Mapping[str, Any]) -> list[str]:
    summary, paired, clause, padded = _headline(data)
    separate = fmt_ratio(summary.get("separate"), "x")
    clause_text = clause or "not paired in this run"
    out = [f"- **ours_packed vs eager_packed (useful tokens/s)**: separate runs {separate}; {clause_text}."]
    if clause is None:
        first, second = paired_names(paired)
        out.append(f"- **{second} vs {first} (useful tokens/s, `--paired`)**: {_fmt_paired(paired)}.")
    if padded:
        out.append(
            f"- **ours_padded (useful tokens/s)**: {padded} (padded graphs against Bridge's packed eager step and "
            "against the same padded rows eagerly)."
        )
    refused = (data.get("variants") or {}).get("ours_packed") or {}
    if refused.get("status") == REFUSED:
        out.append(f"- **ours_packed refused by the capture plan**: {refused.get('reason', '?')}")
    verdict = {True: "**met**", False: "**not met**", None: "not measured"}[summary.get("met")]
    on = f" (judged on the {summary['met_on']})" if summary.get("met_on") else ""
    target = summary.get("target", TARGET_SPEEDUP)
    out.append(f"- Target of issue #17 on this shape: ours_packed >= {target:g}x eager_packed: {verdict}{on}.")
    floor = summary.get("noise_floor")
    if floor is not None:
        out.append(
            f"- Run-to-run noise floor: eager_packed_repeat's useful tokens/s lies {100 * floor:.1f}% from "
            "eager_packed's (same model, weights, samples and steps, run last)."
        )
    return out


def remaining_time(data: Mapping[str, Any]) -> list[str]:
    """Where ours_packed's step time goes: kernels against idle, padding in the computed slots, kernel time against
    eager_packed's, and :func:`host_time_section`."""
    variants = data.get("variants") or {}
    ours, eager = variants.get("ours_packed") or {}, variants.get(BASELINE) or {}
    if ours.get("status") != "ok":
        return []
    same, step = _num(ours.get("step_ms_same_microbatches")), _step_ms(ours)
    kernel = _num(ours.get("kernel_ms_per_step"))
    facts = []
    if step is not None and kernel is not None:
        where = "the profiled steps' micro-batches, unprofiled" if same else "median of the measured steps"
        facts.append(
            f"per step {fmt_ms(step)} ms wall ({where}), of which the GPU runs kernels {fmt_ms(kernel)} ms "
            f"({_fmt(kernel / step, '.0%')}) and idles {fmt_ms(max(0.0, step - kernel))} ms: host time the graphs "
            "did not remove"
        )
        useful = ours.get("useful_tokens_per_step") or []
        if useful and kernel > 0:
            bound = statistics.fmean(useful) / (kernel / 1e3)
            base = _num(eager.get("useful_tokens_per_s"))
            ratio = f" ({bound / base:.2f}x eager_packed)" if base else ""
            facts.append(f"with the GPU never idle it would deliver {bound:,.0f} useful tok/s{ratio}")
    if (fill := _num(ours.get("fill_fraction"))) is not None:
        facts.append(
            f"{_fmt(1 - fill, '.0%')} of the token slots it computes are padding (each micro-batch, its rows' tails "
            "dropped where tight packing is on, is padded to the smallest language budget of "
            f"{data.get('data', {}).get('language_budgets')} that holds it; eager_packed "
            f"computes {_fmt(1 - (_num(eager.get('fill_fraction')) or 1), '.0%')} padding)"
        )
    cuda_only = ours.get("cuda_only_profile") or {}
    if _num(cuda_only.get("busy")) is not None:
        eager_busy = _num((eager.get("cuda_only_profile") or {}).get("busy"))
        facts.append(
            f"under a profiler that records CUDA kernels only (no CPU ops, markers or stacks), the GPU is busy "
            f"{cuda_only['busy']:.2f} of the same micro-batches' steps ({fmt_ms(cuda_only.get('kernel_ms_per_step'))} "
            f"ms of kernels in {fmt_ms(cuda_only.get('window_ms_per_step'))} ms per step"
            + (f"; eager_packed {eager_busy:.2f}" if eager_busy is not None else "")
            + ")"
        )
    if kernel is not None and (ek := _num(eager.get("kernel_ms_per_step"))):
        facts.append(f"its kernel time is {kernel / ek:.2f}x eager_packed's ({fmt_ms(ek)} ms) for the same samples")
    return ["## Where ours_packed's step time goes", "", *_sentences(facts), *host_time_section(ours, eager)]


def render_markdown(data: Mapping[str, Any]) -> str:
    """The whole ``useful_tokens.md``."""
    meta = data.get("meta") or {}
    config = meta.get("config") or {}
    out = ["# Useful tokens per second: Bridge's packed eager step vs padded and packed graphs", ""]
    out.append(
        f"Measured on {meta.get('gpu', '?')}, {meta.get('date', '?')}; torch {meta.get('torch', '?')}, Transformer "
        f"Engine {meta.get('transformer_engine', '?')}, megatron-core {meta.get('megatron_core', '?')}, "
        f"Megatron-Bridge {meta.get('megatron_bridge', '?')}."
    )
    if meta.get("command"):
        out.append(f"Command: `{meta['command']}`.")
    out.append("")
    out.append(
        f"Model {config.get('model', '?')} ({config.get('description', '')}), sequence {config.get('seq_length')}, "
        f"micro-batch {config.get('micro_batch_size')}, {config.get('num_microbatches')} micro-batches per step; "
        f"one GPU, the same initial weights and samples for every variant; {config.get('warmup_steps')} eager "
        f"warm-up steps, capture, {config.get('measured_steps')} measured steps (Megatron's schedule and the "
        f"distributed optimizer; wall time between synchronizes). Data: {(data.get('data') or {}).get('source', '?')}."
    )
    out += ["", *table(data), "", "![useful tokens per second per variant](useful_tokens.png)", ""]
    out += [*_verdict_lines(data), *_notes(data), ""]
    for section in (memory_section, encoder_and_mfu_section, remaining_time, host_syncs_section):
        out += section(data)
    out += ["## How it is measured", "", *HOW, ""]
    return "\n".join(out)


HOW = (
    "- **useful tok/s**: tokens that carry loss (`loss_mask` summed over each step's micro-batches; the same for "
    "every variant) over the measured steps' total wall time. **x vs eager_packed**: its ratio to eager_packed's.",
    "- **fill**: real tokens (the samples' own) over the token slots the language model computes: eager_packed rows x "
    "the step's padded width; ours_packed the packed graph budget it replays in (with tight packing, the budget of "
    "each row's kept prefix, its extent rounded up to 16, summed over the rows; ours_packed_rows, tight packing off, "
    "the budget of the rows' full width); padded variants rows x seq_length.",
    "- **kernel ms/step**: union of CUDA kernel intervals (over streams) in a few profiled steps after the measured "
    "ones (`torch.profiler`, benchmarks/trace.py), per step. **GPU busy (in profiled steps)**: that kernel time over "
    "the profiled steps' own wall time (`gpu_busy_in_profiled_steps`: kernels and idle of the same steps; dividing by "
    "the unprofiled median instead mixes two runs of the steps and read lower). **step / kernel**: the unprofiled "
    "median wall time of the profiled steps' own micro-batches over their kernel time per step "
    "(`step_ms_same_microbatches`: the same micro-batches on both sides; 1.00x: the GPU never waits for the host). † "
    "the profiler missed the variant's graph kernels: GPU busy is the eager variant's kernel time over the unprofiled "
    "median step, and step / kernel uses the (too low) profiled kernel time. The step-time section also gives the GPU "
    "busy under a profiler that records CUDA kernels only (the profiled steps' micro-batches again, between two "
    "marker kernels: `cuda_only_profile`, benchmarks/trace.py `busy_between_marks`), which recording every CPU op "
    "does not stretch; its two steps' losses are not kept.",
    "- **vision ms/mb**: CUDA events around each vision-encoder call of the measured steps (forward, backward). "
    "**MFU**: model FLOPs (`benchmarks/flops.py`, every position of a padded row) over the measured steps' wall time "
    "and the GPU's dense BF16 peak, padded rows of the dense models only; at kernel time: over the profiled steps' "
    "kernel time.",
    "- **graph GiB / capture s**: growth of the caching allocator's reserved memory across all captures, and their "
    "wall time (GiB = 2^30 bytes). **replays / eager fallbacks**: per submodule, over the whole run.",
    "- **parity**: per-token loss of one fixed micro-batch (the one with the most tokens) with the initial weights "
    "copied back in, against the graphs-off variant of the same form (packed vs eager_packed, padded vs eager_padded; "
    "ours_packed_fused vs eager_packed_fused); NaN-safe (a non-finite value is never a match); and every parameter's "
    "gradient, computed for this run, against the reference's and against the reference's own second pass (the "
    "floor): a graphed variant of ours beyond twice the floor, or without the comparison, is failed. Every step's "
    "loss and grad norm must be finite, else the variant is failed. On an MoE model these losses are the language "
    "model's cross-entropy only (the router's load-balancing loss reaches the gradients, so the grad norm, not the "
    "losses).",
    "- **capture counters**: per submodule of a graphed variant, graphs captured, replays and a failed capture; a "
    "submodule without graphs, without replays or with a failed capture is named in the notes.",
    "- **paired phase**: two variants (`--paired A,B`, default eager_packed,ours_packed) alive at once, their "
    "measured steps interleaved (the first of each pair alternating); the per-pair ratio A ms / B ms is B's "
    "useful-tokens/s ratio over A (same samples per pair); median and a 95% interval, the wider of the sign test's "
    "and a moving-block bootstrap's (`report.paired_verdict`): the spread within this call, not between calls; both "
    "models' peak memory beside it. The target is judged on it only where it paired eager_packed and ours_packed.",
    "- **levers** (opt-in with `--variants`): ours_packed_rows is ours_packed with tight packing off (each "
    "micro-batch replays in the budget of its rows' full width); eager_packed_fused and ours_packed_fused train with "
    "`model.gradient_accumulation_fusion=true` (without APEX only Transformer Engine's layers fuse, "
    "bridge_cudagraph/host/wgrad_fusion.py; a fused variant in which no TE module fuses is failed). "
    "ours_packed_fused's parity reference is eager_packed_fused (the same numbers); eager_packed_fused's is "
    "eager_packed, from which its step losses differ slightly (the fused sum rounds once per micro-batch in fp32). "
    "The lever table compares each pair; its noise floor is eager_packed_repeat's median step against eager_packed's "
    "(one pair of runs).",
    "- **host waits**: one more training step after the profiled ones, on the first profiled step's micro-batches, "
    "under torch's sync debug mode (benchmarks/host_syncs.py): each synchronizing call and the Python line that asked "
    "for it (eager_packed and the packed graph variants).",
)


def _notes(data: Mapping[str, Any]) -> list[str]:
    info = data.get("data") or {}
    micro = [MicroBatch(**m) for m in info.get("microbatches") or []]
    notes = []
    if micro:
        keys = ("real_tokens", "loss_tokens", "packed_tokens", "patches")
        real, loss, packed, patches = (f"{min(v)}-{max(v)}" for v in ([getattr(m, k) for m in micro] for k in keys))
        notes.append(
            f"- Data: {len(micro)} distinct micro-batches of {micro[0].rows} samples, cycled; real tokens per "
            f"micro-batch {real}, loss tokens {loss}, packed width x rows {packed}, vision patches {patches}."
        )
    if info.get("language_budgets"):
        notes.append(
            f"- Packed language graphs: budgets {info['language_budgets']} tokens, at most "
            f"{info.get('max_sequences')} sequences, max_seqlen {info.get('max_seqlen')}; vision graphs (ours) "
            f"{info.get('vision_budgets')} patches; upstream's vision graphs one length of "
            f"{info.get('upstream_vision_seq_length')} patches."
        )
    variants = data.get("variants") or {}
    for name in shown(data):
        rec = variants.get(name) or {}
        parity, ok = rec.get("parity") or {}, rec.get("status") == "ok"
        steps = parity.get("steps") or {}
        if ok and steps and parity.get("reference") != name:
            notes.append(
                f"- {name}: step losses vs {parity.get('reference')}: {steps.get('exact_steps')} of "
                f"{steps.get('steps')} identical, max abs diff {fmt_diff(steps.get('max_abs'))}, max rel diff "
                f"{_fmt_rel(steps.get('max_rel'))}."
            )
        if ok and (cross := parity.get("vs_eager_packed_loss_tokens")):
            notes.append(
                f"- {name}: fixed micro-batch, loss tokens against eager_packed's packed form: max abs "
                f"{fmt_diff(cross.get('loss_max_abs'))} (padded BSHD vs packed THD kernels)."
            )
        if ok and (problems := counter_problems(rec.get("counters") or {})):
            notes.append(f"- **{name}: its graphs were not what was timed**: {'; '.join(problems)}.")
        if rec.get("gpu_busy_note"):
            notes.append(f"- {name}: {rec['gpu_busy_note']}")
        if rec.get("profile_error"):
            notes.append(f"- {name}: profiling failed: {rec['profile_error']}")
    return notes


def text_table(data: Mapping[str, Any]) -> str:
    """The short table printed on stdout at the end of a run."""
    variants = data.get("variants") or {}
    columns = ("variant", "useful tok/s", "x", "step ms", "fill", "busy", "graph GiB", "parity")
    picked = [COLUMNS.index(c) for c in (*COLUMNS[:6], "graph GiB", COLUMNS[-1])]
    rows = (variant_row(name, variants.get(name)) for name in shown(data))
    lines = [" | ".join(columns), *(" | ".join(row[i] for i in picked) for row in rows)]
    summary, paired, clause, padded = _headline(data)
    met = {True: "met", False: "not met", None: "not measured"}[summary.get("met")]
    lines.append(
        f"ours_packed vs eager_packed: separate {fmt_ratio(summary.get('separate'), 'x')}; "
        f"{clause or 'not paired'}; target {summary.get('target', TARGET_SPEEDUP):g}x: {met}"
    )
    if clause is None:
        first, second = paired_names(paired)
        lines.append(f"{second} vs {first}: {_fmt_paired(paired)}")
    return "\n".join([*lines, *([f"ours_padded: {padded}"] if padded else [])])


def render_png(data: Mapping[str, Any], path: str | Path) -> Path | None:
    """``useful_tokens.png``: one bar per variant (useful tokens/s), annotated with its ratio to eager_packed and
    its fill; a dashed line at the target (:func:`target_of`). None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    variants = data.get("variants") or {}
    names = shown(data)
    ok = dict(_finished(data))
    values = [_num(ok[n].get("useful_tokens_per_s")) if n in ok else None for n in names]
    top = max([v for v in values if v is not None] or [1.0])
    fig, ax = plt.subplots(figsize=(1.5 * len(names) + 2.0, 4.8))
    for i, (name, v) in enumerate(zip(names, values, strict=True)):
        rec = variants.get(name) or {}
        if v is None:
            label = REFUSED if rec.get("status") == REFUSED else "failed" if rec else "not run"
            ax.text(i, top * 0.05, label, ha="center", va="bottom", fontsize=8, rotation=90)
            continue
        ax.bar(i, v, color=COLORS.get(name, "#777777"), width=0.7)
        ratio, fill = fmt_ratio(rec.get("speedup_vs_eager_packed"), "x"), _fmt(rec.get("fill_fraction"), ".0%")
        ax.text(i, v + top * 0.02, f"{v:,.0f}\n{ratio}\nfill {fill}", ha="center", va="bottom", fontsize=8)
    base = _num((variants.get(BASELINE) or {}).get("useful_tokens_per_s"))
    target = target_of(data)
    if base:
        ax.axhline(base * target, color="#c0392b", linestyle="--", linewidth=1)
        label = f"target {target:g}x eager_packed"
        ax.text(len(names) - 0.5, base * target, label, color="#c0392b", fontsize=8, ha="right", va="bottom")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([n.replace("_", "\n", 1) for n in names], fontsize=8)
    ax.set_ylim(0, top * 1.35)
    ax.set_ylabel("useful tokens / s (loss-carrying)")
    meta = data.get("meta") or {}
    config = meta.get("config") or {}
    ax.set_title(
        f"{config.get('model', '?')} Qwen3-VL, seq {config.get('seq_length')}, mbs {config.get('micro_batch_size')} "
        f"x {config.get('num_microbatches')}, on {meta.get('gpu', '?')}",
        fontsize=10,
    )
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def render(json_path: str | Path) -> dict[str, Path | None]:
    """Write ``useful_tokens.md`` and ``useful_tokens.png`` next to ``json_path``."""
    json_path = Path(json_path)
    data = json.loads(json_path.read_text())
    md = json_path.with_name("useful_tokens.md")
    md.write_text(render_markdown(data))
    return {"md": md, "png": render_png(data, json_path.with_name("useful_tokens.png"))}


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__.split("\n")[0])
    parser.add_argument("json", help="a useful_tokens.json")
    paths = render(parser.parse_args(argv).json)
    print("\n".join(str(p) for p in paths.values() if p))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
