"""What ``useful_tokens.json`` holds (``meta``, ``data``, ``variants``: name: record with ``status`` ok | failed |
refused, ``paired``, ``summary``), the arithmetic of its numbers, and how it reads (``.md``, stdout). No torch, no GPU:
``python -m benchmarks.report DIR/useful_tokens.json`` renders it again on any machine.
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
#: eager_packed again, last (the run-to-run noise floor); eager_padded again where ``--variants`` names it.
CONTROL, PADDED_CONTROL = "eager_packed_repeat", "eager_padded_repeat"
#: Every variant in run order (the control last) and what it is.
LABELS = {
    "eager_packed": "Bridge's default: graphs off, in-batch packing",
    "eager_padded": "graphs off, every row padded to seq_length",
    "upstream_padded": "upstream's TE graphs (megatron-core/Bridge helpers), padded",
    "ours_padded": "bridge_cudagraph: BSHD language + vision graphs, padded",
    "ours_padded_language": "ours_padded with the language graphs only (vision graphs off)",
    PADDED_CONTROL: "eager_padded again (the padded loss curve's noise floor)",
    "ours_packed": "bridge_cudagraph: packed (THD) language + vision graphs",
    CONTROL: "eager_packed again (run-to-run noise floor)",
}
#: Every variant in run order: a variant's parity reference runs before it; the control after all (and the paired).
ORDER = tuple(v for v in LABELS if v != CONTROL)
#: The reference every speed-up is against, and the pair measured side by side unless ``--paired``.
BASELINE, PAIRED = "eager_packed", ("eager_packed", "ours_packed")
PACKED, PADDED = "packed", "padded"
#: The graphs-off variant of each form: the parity reference; a variant's status where the plan refuses its graphs.
REFERENCE, REFUSED = {PACKED: "eager_packed", PADDED: "eager_padded"}, "refused"
REFERENCES = tuple(REFERENCE.values())
PACKED_GRAPHED = tuple(v for v in ORDER if v.startswith("ours_packed"))
PADDED_GRAPHED = tuple(v for v in ORDER if v.startswith("ours_padded"))
#: The part of ours_padded that ``--variants`` may add: the fields it replaces of ours_padded's block, per submodule.
PADDED_PARTS: dict[str, dict[str, dict[str, Any]]] = {"ours_padded_language": {"vision": {"enabled": False}}}
GRAPHED = ("upstream_padded", *PADDED_GRAPHED, *PACKED_GRAPHED)
#: The variants whose one extra step runs under :func:`benchmarks.host_syncs.census` (eager_packed for comparison).
HOST_SYNC_VARIANTS = ("eager_packed", *PACKED_GRAPHED)
#: The micro-batch form each variant trains on (every padded variant's name has ``_padded``).
FORM = {v: PADDED if "_padded" in v else PACKED for v in LABELS}
#: The target for ours_packed over eager_packed (useful tokens/s): on the 2B shape, and per ``meta.config.model``.
TARGET_SPEEDUP = 1.3
TARGETS = {"tiny": TARGET_SPEEDUP, "small": TARGET_SPEEDUP, "peft8b": 1.15}
GIB = 2**30
#: Confidence of the paired phase's interval for the median ratio, and the bootstrap's resamples.
PAIRED_CONFIDENCE, BOOTSTRAP_RESAMPLES = 0.95, 4000
#: GPU busy under which the report says where the remaining host time goes.
GPU_BUSY_TARGET = 0.95
#: The packed ladder's memory targets: ours_packed's peak reserved over eager_packed's; the pools over the top rung's.
RESERVED_TARGET, LADDER_TARGET = 1.15, 1.1
#: What earlier variants may leave allocated before the memory section says a variant's peaks include it.
LEFTOVER_NOTED_BYTES = 512 * 2**20
#: The table's header.
COLUMNS = tuple(
    "variant | useful tok/s | x vs eager_packed | step ms (median, IQR) | fill | GPU busy (in profiled steps) | "
    "kernel ms/step | step / kernel | graph GiB | peak GiB (allocated / reserved) | capture s | replays / eager "
    "fallbacks | parity: fixed micro-batch (max abs per-token loss diff; gradients vs the eager floor)".split(" | ")
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


def _gib(value: Any, spec: str = ".1f") -> str:
    x = _num(value)
    return _fmt(None if x is None else x / GIB, spec)


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
    """A markdown table and a blank line; ``header``: its cells, or one string of them joined by `` | ``."""
    header = header.split(" | ") if isinstance(header, str) else header
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return [*lines, *("| " + " | ".join(row) + " |" for row in rows), ""]


def _step_ms(rec: Mapping[str, Any]) -> float | None:
    """The unprofiled step of the profiled steps' micro-batches; a record from before the field: the median step."""
    return _num(rec.get("step_ms_same_microbatches" if "step_ms_same_microbatches" in rec else "step_ms_median"))


def step_over_kernel(variant: Mapping[str, Any]) -> float | None:
    """:func:`_step_ms` over the kernel time per step (None where either is missing); 1.00x: the GPU never waits."""
    return _over(_step_ms(variant), variant.get("kernel_ms_per_step"))


def kernel_time_missed(rec: Mapping[str, Any]) -> bool:
    """Whether the profiler missed the graph kernels (GPU busy then from eager's kernel time: benchmarks/trace.py)."""
    return rec.get("gpu_busy_source") not in (None, "profiler")


def block_bootstrap_ci(
    values: Sequence[float],
    confidence: float = PAIRED_CONFIDENCE,
    *,
    block: int | None = None,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float] | None:
    """Percentile interval of the median of ``values`` (in order) by a seeded moving-block bootstrap; None under 6."""
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
    """The sign test's distribution-free interval for the median of independent values (None: too few)."""
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
    """Per-pair step-time ratios (in order; above 1: the second faster) judged: ``median``, the wider ``confidence``
    interval of :func:`sign_test_ci` and :func:`block_bootstrap_ci`, ``verdict`` (faster, slower, within noise)."""
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
    """Ours' GPU-idle time per profiled step by phase, CPU op and runtime call, beside eager's (under ``target``)."""
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
        f"({_fmt(host.get('idle_fraction'), '.0%')} of the step; eager: {fmt_ms(eager.get('idle_ms_per_step'))} ms), "
        "each idle instant counted for the innermost `bcg_phase/` marker and the CPU ops and runtime calls then open."
    )
    if kernel_time_missed(ours):
        out.append("Caveat: the profiler missed graph kernels (GPU busy from eager's): the idle below is overstated.")
    phases, keys = (host.get("by_phase") or {}, eager.get("by_phase") or {}), ("idle_ms_per_step", "wall_ms_per_step")
    rows = [
        [phase, *(fmt_ms((p.get(phase) or {}).get(k)) for p in phases for k in keys)]
        for phase in [*phases[0], *(k for k in phases[1] if k not in phases[0])]
    ]
    header = (
        "`bcg_phase/` (benchmarks/runner.py) | ours GPU-idle ms/step | ours wall ms/step | eager GPU-idle | eager wall"
    )
    out += ["", *_table(header, rows)]
    if (outside := _num(host.get("idle_outside_ops_ms_per_step"))) is not None:
        out.append(f"- {fmt_ms(outside)} ms of ours' idle time per step overlaps no CPU op and no CUDA runtime call.")
    gaps = [
        f"{g.get('range', '?')}: {fmt_count(g.get('gaps_per_step'))} gaps, {fmt_ms(g.get('ms_per_step'))} ms"
        for g in host.get("idle_by_gap_length") or []
    ]
    out += [f"- Ours' idle gaps by length, per step: {'; '.join(gaps)}.", ""] if gaps else [""]
    for key, title in (("top_cpu_ops", "CPU op"), ("top_runtime", "CUDA runtime call")):
        theirs = {r.get("name"): r for r in eager.get(key) or []}
        rows = []
        for r in host.get(key) or []:
            name = f"`{str(r.get('name')).replace('|', '/')}`"
            idle, cpu = fmt_ms(r.get("idle_ms_per_step")), fmt_ms(r.get("cpu_ms_per_step"))
            eager_ms = fmt_ms(e.get("idle_ms_per_step")) if (e := theirs.get(r.get("name"))) else "-"
            rows.append([name, idle, fmt_count(r.get("calls_per_step")), cpu, eager_ms])
        if rows:
            out += _table(f"{title} | ours GPU-idle overlap ms/step | calls/step | CPU ms/step | eager's", rows)
    if host.get("top_cpu_ops") or host.get("top_runtime"):
        out += ["(-: not among eager's top entries.)", ""]
    return out


@dataclass(frozen=True)
class MicroBatch:
    """One collated micro-batch's numbers (``T``: ``packed_tokens``, ``T'``: ``tight_tokens``, 0 if unknown)."""

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
    """Token slots computed for ``mb``: padded rows x seq_length; eager ``T``; packed graphs the budget ``T`` fits."""
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


def summarize(data: Mapping[str, Any], *, target: float | None = None) -> dict[str, Any]:
    """ours_packed against eager_packed (separate, paired), the target met on the paired interval or separate runs."""
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
    a, b = (_num(rec.get("step_ms_median")) if _ok(rec) else None for rec in (base, variants.get(CONTROL)))
    out["step_noise_floor"] = abs(b / a - 1.0) if a and b is not None else None
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
    """A fixed-batch record's gradient comparison: share bit-exact, max relative difference, floor, verdict."""
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
    """Each submodule of a graphed variant without graphs, without a replay, or whose capture failed."""
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
    if not rec:
        return [name, "not run", *["n/a"] * (len(COLUMNS) - 2)]
    if not _ok(rec):
        refused = rec.get("status") == REFUSED
        why = f"refused: {rec.get('reason') or '?'}" if refused else f"failed: {_line(rec.get('error') or 'failed')}"
        return [name, why.replace("|", "/"), *["n/a"] * (len(COLUMNS) - 2)]
    graphed, step_kernel = name in GRAPHED, fmt_ratio(step_over_kernel(rec), "x")
    busy = _fmt(rec.get("gpu_busy_in_profiled_steps"), ".2f")
    if kernel_time_missed(rec):  # GPU busy estimated from eager's kernel time: both cells carry †
        busy, step_kernel = _fmt(rec.get("gpu_busy"), ".2f"), step_kernel + "†"
        busy += "†" if busy != "n/a" else ""
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
        f"{_gib(rec.get('peak_memory_bytes'))} / {_gib(rec.get('peak_reserved_bytes'))}",
        fmt_ratio(rec.get("capture_s")) if graphed else "-",
        ", ".join(f"{sub} {c.get('replays', 0)} / {c.get('eager_fallbacks', 0)}" for sub, c in counters) or "-",
        _fmt_parity(name, rec),
    ]


def shown(data: Mapping[str, Any]) -> list[str]:
    """The table's rows in run order: the default variants, the others that ran, the control."""
    present = data.get("variants") or {}
    return [*(v for v in ORDER if v in VARIANTS or v in present), *([CONTROL] if CONTROL in present else [])]


def _finished(data: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """``(name, record)`` of every finished variant, in :func:`shown`'s order."""
    variants = data.get("variants") or {}
    return [(n, variants[n]) for n in shown(data) if _ok(variants.get(n))]


def table(data: Mapping[str, Any]) -> list[str]:
    """The markdown table of every variant."""
    variants = data.get("variants") or {}
    return _table(COLUMNS, [variant_row(name, variants.get(name)) for name in shown(data)])[:-1]


def memory_section(data: Mapping[str, Any]) -> list[str]:
    """``## Memory``: peaks, ours_packed's ladders rung by rung, the plan's estimate against the measured pools."""
    variants = data.get("variants") or {}
    base_reserved = _num((variants.get(BASELINE) or {}).get("peak_reserved_bytes"))
    rows, notes = [], []
    for name, rec in _finished(data):
        allocated, reserved = _num(rec.get("peak_memory_bytes")), _num(rec.get("peak_reserved_bytes"))
        graph = _fmt(rec.get("graph_memory_gib"), ".1f") if name in GRAPHED else "-"
        vs_eager, outside = fmt_ratio(_over(reserved, base_reserved), "x"), _gib(rec.get("outside_allocator_bytes"))
        rows.append([name, _gib(allocated), _gib(reserved), vs_eager, graph, outside])
        if (start := _num(rec.get("allocated_at_start_bytes")) or 0) > LEFTOVER_NOTED_BYTES:
            own = (reserved or 0) - (_num(rec.get("reserved_at_start_bytes")) or start)
            own_peaks = f"{_gib((allocated or 0) - start)} / {_gib(own)} GiB allocated / reserved"
            notes.append(
                f"- {name} started with {_gib(start)} GiB earlier variants left allocated; its own: {own_peaks}."
            )
    header = "variant | peak allocated GiB | peak reserved GiB | reserved vs eager_packed | graph GiB | outside the "
    header += "allocator GiB"
    out = ["## Memory", "", *(_table(header, rows) if rows else []), *notes]
    ours = variants.get("ours_packed") or {}
    if (ratio := _over(ours.get("peak_reserved_bytes"), base_reserved)) is not None:
        met = _met(ratio <= RESERVED_TARGET)
        out.append(
            f"- **ours_packed's peak reserved** is {ratio:.2f}x eager_packed's (at most {RESERVED_TARGET}x: {met})."
        )
    ladders, rungs, estimates = [], [], []
    for sub, rec in sorted((ours.get("capture") or {}).items()):
        per_budget = {int(k): int(v) for k, v in (rec.get("per_budget") or {}).items()}
        live = {int(k): int(v) for k, v in (rec.get("per_budget_live") or {}).items()}
        if not per_budget:
            continue
        top, total = max(per_budget), sum(per_budget.values())
        ratio = total / per_budget[top] if per_budget[top] else float("nan")
        # ``rec`` is the helper's stats at the capture; rungs captured after it are in ours["late_captures"].
        late = sum(len(g.get("budgets") or []) for g in ours.get("late_captures") or [] if g.get("submodule") == sub)
        captured = f"{list(rec.get('budgets_captured') or sorted(per_budget))} (up to {rec.get('budget_source')})"
        met = f"{_met(ratio <= LADDER_TARGET)} (at most {LADDER_TARGET}x)"
        pools, top_gib = _gib(total, ".2f"), _gib(per_budget[top], ".2f")
        later = str(max(late, rec.get("late_captures", 0)))
        ladders.append([sub, captured, pools, f"{ratio:.2f}x", top_gib, met, later])
        rungs += [
            [sub, str(b), f"{per_budget[b] / 2**20:,.0f}", f"{live.get(b, 0) / 2**20:,.0f}"]
            for b in sorted(per_budget, reverse=True)
        ]
    for sub, est in sorted((ours.get("memory_estimate") or {}).items()):
        ratio = _num(est.get("measured_over_estimate"))
        within = "**yes**" if ratio and abs(ratio - 1) <= 0.2 else "**no**"
        sizes = [_gib(est.get(key), ".2f") for key in ("estimate_bytes", "measured_bytes")]
        estimates.append([sub, str(est.get("top")), *sizes, fmt_ratio(ratio, "x"), f"{within} (within 20%)"])
    if ladders:
        header = (
            "ladder | budgets captured | pools GiB | x largest rung | largest rung GiB | target | rungs captured later"
        )
        out += [
            "",
            *_table(header, ladders),
            *_table("ladder | budget | reserved growth MiB | of it kept alive MiB", rungs),
        ]
    if estimates:
        out += _table("pool | top | plan/memory.py estimate GiB | measured GiB | x estimate | verdict", estimates)
    for g in ours.get("late_captures") or []:
        out.append(f"- before step {g.get('step')}: {g.get('submodule')} budgets {g.get('budgets')} captured (late).")
    if cap := ((data.get("meta") or {}).get("config") or {}).get("gpu_memory_cap_gib"):
        out.append(f"- The process was capped at {cap:g} GiB (`--gpu-memory`).")
    return [*out, ""]


def encoder_and_mfu_section(data: Mapping[str, Any]) -> list[str]:
    """``## Vision encoder and MFU``: encoder ms per micro-batch; MFU of padded rows (-: not taken)."""
    rows = [
        [name, *(fmt_ms(rec.get(k)) for k in ("vision_fwd_ms", "vision_bwd_ms", "vision_ms"))]
        + [fmt_ratio(rec.get("vision_microbatches_per_step"))]
        + [_fmt(rec.get(k), ".1%") if k in rec else "-" for k in ("mfu", "mfu_at_kernel_time")]
        for name, rec in _finished(data)
        if rec.get("vision_calls") is not None
    ]
    header = "variant | vision fwd ms/mb | vision bwd ms/mb | vision ms/mb | calls/step | MFU | MFU at kernel time"
    return ["## Vision encoder and MFU", "", *_table(header, rows)] if rows else []


def host_syncs_section(data: Mapping[str, Any]) -> list[str]:
    """``## Host waits on the GPU``: the census of each of :data:`HOST_SYNC_VARIANTS` that took one."""
    variants = data.get("variants") or {}
    lines = census_lines(variants, [n for n in shown(data) if n in HOST_SYNC_VARIANTS])
    for n in shown(data):
        if error := (variants.get(n) or {}).get("host_syncs_error"):
            lines.append(f"- {n}: census failed: {error}")
    return ["## Host waits on the GPU (one training step)", "", *lines, ""] if lines else []


def _fmt_paired(paired: Mapping[str, Any] | None) -> str:
    """The paired phase in one clause: its median per-pair ratio, interval and verdict, or why it did not run."""
    if not paired:
        return "paired phase not run"
    if paired.get("status") == "skipped":
        return f"paired phase skipped: {paired.get('reason', '?')}"
    if paired.get("status") != "ok":
        return f"paired phase failed: {str(paired.get('error', '?'))[:200]}"
    judged = paired_verdict(paired.get("ratios") or [])
    if judged["ci"] is None:
        return f"paired {fmt_ratio(judged['median'], 'x')} over {judged['pairs']} pairs (too few for an interval)"
    (lo, hi), (first, second) = judged["ci"], paired_names(paired)
    peaks = f"{_gib(paired.get('peak_memory_bytes'))} / {_gib(paired.get('peak_reserved_bytes'))}"
    memory = f"; both models' peak {peaks} GiB allocated / reserved" if "peak_memory_bytes" in paired else ""
    return (
        f"paired (both models alive, steps interleaved) median per-pair ratio {first} ms / {second} ms "
        f"{judged['median']:.3f}x, within-call 95% interval [{lo:.3f}, {hi:.3f}] over {judged['pairs']} pairs "
        f"({judged['ours_faster_pairs']} with {second} faster): {judged['verdict']}{memory}"
    )


def _met(met: bool | None) -> str:
    return {True: "**met**", False: "**not met**", None: "not measured"}[met]


def verdicts(data: Mapping[str, Any]) -> dict[str, str]:
    """The run's verdicts, ``what: verdict`` (:func:`summarize`, the paired phase, ours_padded, a refusal)."""
    summary, paired = data.get("summary") or summarize(data), data.get("paired")
    first, second = paired_names(paired)
    clause = _fmt_paired(paired) if (first, second) == PAIRED else "not paired in this run"
    separate = f"separate runs {fmt_ratio(summary.get('separate'), 'x')}; {clause}"
    out = {"ours_packed vs eager_packed (useful tokens/s)": separate}
    if (first, second) != PAIRED:
        out[f"{second} vs {first} (useful tokens/s, `--paired`)"] = _fmt_paired(paired)
    padded = summary.get("ours_padded") or {}
    if any(x is not None for x in padded.values()):
        out["ours_padded (useful tokens/s)"] = ", ".join(f"{fmt_ratio(x, 'x')} vs {r}" for r, x in padded.items())
    if (refused := (data.get("variants") or {}).get("ours_packed") or {}).get("status") == REFUSED:
        out["ours_packed refused by the capture plan"] = refused.get("reason", "?")
    on = f" (judged on the {summary['met_on']})" if summary.get("met_on") else ""
    target = f"Target of issue #17: ours_packed >= {summary.get('target', TARGET_SPEEDUP):g}x eager_packed"
    out[target] = _met(summary.get("met")) + on
    if (floor := summary.get("noise_floor")) is not None:
        out["Noise floor"] = f"eager_packed_repeat's useful tokens/s {100 * floor:.1f}% from eager_packed's"
    return out


def remaining_time(data: Mapping[str, Any]) -> list[str]:
    """``## Where ours_packed's step time goes``: kernels, idle, padding, and :func:`host_time_section`."""
    variants = data.get("variants") or {}
    ours, eager = variants.get("ours_packed") or {}, variants.get(BASELINE) or {}
    if ours.get("status") != "ok":
        return []
    step, kernel, rows = _step_ms(ours), _num(ours.get("kernel_ms_per_step")), {}
    if step is not None and kernel is not None:
        where = "profiled steps' micro-batches" if ours.get("step_ms_same_microbatches") else "median step"
        share = f"{fmt_ms(kernel)} ({_fmt(kernel / step, '.0%')}), {fmt_ms(max(0.0, step - kernel))}"
        rows[f"wall ms ({where}): kernels (share), idle"] = f"{fmt_ms(step)}: {share}"
        if (useful := ours.get("useful_tokens_per_step") or []) and kernel > 0:
            bound, base = statistics.fmean(useful) / (kernel / 1e3), _num(eager.get("useful_tokens_per_s"))
            ratio = f" ({bound / base:.2f}x eager_packed)" if base else ""
            rows["useful tok/s, the GPU never idle"] = f"{bound:,.0f}{ratio}"
    if (fill := _num(ours.get("fill_fraction"))) is not None:
        eager_pad = _fmt(1 - (_num(eager.get("fill_fraction")) or 1), ".0%")
        budgets = (data.get("data") or {}).get("language_budgets")
        rows[f"padding of the slots (budgets {budgets})"] = f"{_fmt(1 - fill, '.0%')} (eager_packed {eager_pad})"
    if (busy := _num((cuda := ours.get("cuda_only_profile") or {}).get("busy"))) is not None:
        eager_busy = _num((eager.get("cuda_only_profile") or {}).get("busy"))
        theirs = f"; eager_packed {eager_busy:.2f}" if eager_busy is not None else ""
        kernels = f"{fmt_ms(cuda.get('kernel_ms_per_step'))} of {fmt_ms(cuda.get('window_ms_per_step'))} ms per step"
        rows["GPU busy, CUDA-only profile"] = f"{busy:.2f} ({kernels}{theirs})"
    if kernel is not None and (ek := _num(eager.get("kernel_ms_per_step"))):
        rows["kernel time against eager_packed's"] = f"{kernel / ek:.2f}x ({fmt_ms(ek)} ms)"
    table = _table("ours_packed per step | ", list(rows.items())) if rows else []
    return ["## Where ours_packed's step time goes", "", *table, *host_time_section(ours, eager)]


def _notes(data: Mapping[str, Any]) -> list[str]:
    info, variants = data.get("data") or {}, data.get("variants") or {}
    notes = []
    if micro := [MicroBatch(**m) for m in info.get("microbatches") or []]:
        keys = ("real_tokens", "loss_tokens", "packed_tokens", "patches")
        real, loss, packed, patches = (f"{min(v)}-{max(v)}" for v in ([getattr(m, k) for m in micro] for k in keys))
        notes.append(
            f"- Data: {len(micro)} distinct micro-batches of {micro[0].rows} samples, cycled; per micro-batch real "
            f"tokens {real}, loss tokens {loss}, packed width x rows {packed}, vision patches {patches}."
        )
    if info.get("language_budgets"):
        notes.append(
            f"- Graphs: packed language budgets {info['language_budgets']}, at most {info.get('max_sequences')} "
            f"sequences, max_seqlen {info.get('max_seqlen')}; ours' vision budgets {info.get('vision_budgets')} "
            f"patches; upstream's vision graphs {info.get('upstream_vision_seq_length')} patches."
        )
    for name in shown(data):
        rec = variants.get(name) or {}
        parity, ok = rec.get("parity") or {}, rec.get("status") == "ok"
        if ok and (steps := parity.get("steps")) and parity.get("reference") != name:
            notes.append(
                f"- {name}: step losses vs {parity.get('reference')}: {steps.get('exact_steps')} of "
                f"{steps.get('steps')} identical, max abs diff {fmt_diff(steps.get('max_abs'))}, max rel diff "
                f"{_fmt_rel(steps.get('max_rel'))}."
            )
        if ok and (cross := parity.get("vs_eager_packed_loss_tokens")):
            max_abs = fmt_diff(cross.get("loss_max_abs"))
            notes.append(f"- {name}: fixed micro-batch vs eager_packed's packed form: loss tokens' max abs {max_abs}.")
        if ok and (problems := counter_problems(rec.get("counters") or {})):
            notes.append(f"- **{name}: its graphs were not what was timed**: {'; '.join(problems)}.")
        if rec.get("gpu_busy_note"):
            notes.append(f"- {name}: {rec['gpu_busy_note']}")
        if rec.get("profile_error"):
            notes.append(f"- {name}: profiling failed: {rec['profile_error']}")
    return notes


HOW = """\
- **useful tok/s**: loss-carrying tokens over the measured steps' wall time. **fill**: real tokens over the slots
  computed (eager_packed rows x the step's width; ours_packed the budget it replays in, tight packing: of each row's
  kept prefix, its extent rounded up to 16; padded rows x seq_length). **graph GiB**: reserved growth of the captures.
- **kernel ms/step**: union of kernel intervals per profiled step (`torch.profiler`, benchmarks/trace.py); **GPU busy**
  over the profiled steps' wall time. **step / kernel**: the same micro-batches' unprofiled step over it (1.00x: the
  GPU never waits). †: graph kernels missed, busy from eager's kernel time. GiB = 2^30 bytes.
- **parity**: one fixed micro-batch's per-token loss and every parameter's gradient against the graphs-off variant of
  its form and its floor (its own second pass): beyond twice the floor, or a non-finite loss or grad norm, fails.
- **paired**: two variants alive, steps interleaved; per pair A ms / B ms; median, 95% interval (the wider of the sign
  test's and a moving-block bootstrap's): the spread within this call. Method: benchmarks/README.md.
"""


def render_markdown(data: Mapping[str, Any]) -> str:
    """The whole ``useful_tokens.md``."""
    meta = data.get("meta") or {}
    config, versions = meta.get("config") or {}, ("torch", "transformer_engine", "megatron_core", "megatron_bridge")
    run = ", ".join([meta.get("gpu", "?"), meta.get("date", "?"), *(f"{k} {meta.get(k, '?')}" for k in versions)])
    out = [
        "# Useful tokens per second: Bridge's packed eager step vs padded and packed graphs",
        "",
        f"{run}. " + (f"`{meta['command']}`" if meta.get("command") else ""),
        "",
        f"Model {config.get('model', '?')} ({config.get('description', '')}), sequence {config.get('seq_length')}, "
        f"micro-batch {config.get('micro_batch_size')} x {config.get('num_microbatches')} per step; one GPU, every "
        f"variant the same weights and samples; {config.get('warmup_steps')} eager warm-up steps, capture, "
        f"{config.get('measured_steps')} measured steps. Data: {(data.get('data') or {}).get('source', '?')}.",
        "",
        *table(data),
        "",
        *(f"- **{what}**: {verdict}." for what, verdict in verdicts(data).items()),
        *_notes(data),
        "",
    ]
    for section in (memory_section, encoder_and_mfu_section, remaining_time, host_syncs_section):
        out += section(data)
    return "\n".join([*out, "## How it is measured", "", HOW])


def text_table(data: Mapping[str, Any]) -> str:
    """The short table printed on stdout at the end of a run, and the verdicts."""
    variants = data.get("variants") or {}
    picked = [COLUMNS.index(c) for c in (*COLUMNS[:6], "graph GiB", COLUMNS[-1])]
    rows = [variant_row(name, variants.get(name)) for name in shown(data)]
    lines = [" | ".join(COLUMNS[i].split(" (")[0] for i in picked), *(" | ".join(r[i] for i in picked) for r in rows)]
    return "\n".join([*lines, *(f"{what}: {verdict}".replace("**", "") for what, verdict in verdicts(data).items())])


def render(json_path: str | Path) -> dict[str, Path]:
    """Write ``useful_tokens.md`` next to ``json_path``; returns ``{"md": its path}``."""
    json_path = Path(json_path)
    md = json_path.with_name("useful_tokens.md")
    md.write_text(render_markdown(json.loads(json_path.read_text())))
    return {"md": md}


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__.split("\n")[0])
    parser.add_argument("json", help="a useful_tokens.json")
    print(render(parser.parse_args(argv).json)["md"])
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
