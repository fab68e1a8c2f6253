"""Render and merge benchmark results (``bench.json`` written by :mod:`bridge_cudagraph.bench`) on any machine.

No torch, no GPU: ``render(json_path)`` writes ``bench.md`` (one markdown table per configuration, plus a summary)
and ``bench.png`` (step time per configuration and variant, parity annotated) next to the JSON. ``merge`` joins
the JSON files of several runs (the full matrix may be split over several device calls) into one.

Command line::

    python -m bridge_cudagraph.bench_report render results/bench/bench.json
    python -m bridge_cudagraph.bench_report merge a/bench.json b/bench.json --out results/bench
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: Variants in the order they are run and shown.
VARIANTS = ("eager", "upstream", "ours")
LABELS = {
    "eager": "eager (graphs off)",
    "upstream": "upstream (Bridge/megatron-core TE graphs)",
    "ours": "ours (bridge_cudagraph)",
}
#: DESIGN.md's parity bound (max abs per-token / per-step loss difference).
LOSS_BOUND = 1e-3
_GIB = 2**30
_MIB = 2**20

COLUMNS = (
    "variant",
    "step ms",
    "speedup vs eager",
    "GPU busy",
    "capture s",
    "peak mem GiB",
    "graph mem MiB",
    "max abs loss diff vs eager",
    "per-token loss diff (fixed batch)",
    "vision ms/mb",
)


# ---------------------------------------------------------------------------------------------- formatting
def _num(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) or math.isinf(x) else x


def fmt_ms(value: Any) -> str:
    """Milliseconds: one decimal from 10 ms up, two below."""
    x = _num(value)
    if x is None:
        return "n/a"
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def fmt_ratio(value: Any, suffix: str = "") -> str:
    """A ratio with two decimals (``2.51x``)."""
    x = _num(value)
    return "n/a" if x is None else f"{x:.2f}{suffix}"


def fmt_diff(value: Any) -> str:
    """A loss difference: ``0 (exact)``, ``3.2e-05``, or bold when over :data:`LOSS_BOUND`."""
    x = _num(value)
    if x is None:
        return "n/a"
    if x == 0:
        return "0 (exact)"
    text = f"{x:.1e}"
    return f"**{text}**" if x > LOSS_BOUND else text


def fmt_bytes(value: Any, unit: int, digits: int = 1) -> str:
    """Bytes in ``unit`` (GiB/MiB)."""
    x = _num(value)
    return "n/a" if x is None else f"{x / unit:.{digits}f}"


def _fmt_busy(variant: dict) -> str:
    busy = _num(variant.get("gpu_busy"))
    if busy is None:
        return "n/a"
    text = f"{busy:.2f}"
    source = variant.get("gpu_busy_source")
    if source and source != "profiler":
        text += "†"
    return text


def _fmt_vision(variant: dict) -> str:
    total = _num(variant.get("vision_ms"))
    fwd, bwd = _num(variant.get("vision_fwd_ms")), _num(variant.get("vision_bwd_ms"))
    if total is None and fwd is None:
        return "n/a"
    if fwd is not None and bwd is not None:
        return f"{fmt_ms(total if total is not None else fwd + bwd)} ({fmt_ms(fwd)} + {fmt_ms(bwd)})"
    return f"{fmt_ms(fwd)} (fwd)"


def variant_row(name: str, variant: dict | None) -> list[str]:
    """One table row for ``variant`` (a failed or missing variant still gets a row saying so)."""
    if not variant:
        return [name, "not run", *["n/a"] * (len(COLUMNS) - 2)]
    if variant.get("status") != "ok":
        error = str(variant.get("error") or "failed").splitlines()[0][:120].replace("|", "/")
        return [name, f"failed: {error}", *["n/a"] * (len(COLUMNS) - 2)]
    graphed = name != "eager"
    fixed = variant.get("fixed_batch") or {}
    return [
        name,
        fmt_ms(variant.get("step_ms_median")),
        fmt_ratio(variant.get("speedup_vs_eager"), "x"),
        _fmt_busy(variant),
        fmt_ratio(variant.get("capture_s")) if graphed else "-",
        fmt_bytes(variant.get("peak_memory_bytes"), _GIB),
        fmt_bytes(variant.get("graph_memory_bytes"), _MIB, 0) if graphed else "-",
        fmt_diff(variant.get("loss_max_abs_diff_vs_eager")) if graphed else "-",
        fmt_diff(fixed.get("loss_max_abs_diff")) if graphed else "-",
        _fmt_vision(variant),
    ]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _config_notes(config: dict) -> list[str]:
    notes = []
    patches = config.get("patches_per_microbatch") or []
    if patches:
        frames = config.get("frames_per_microbatch") or []
        notes.append(
            f"- Data: {len(patches)} distinct micro-batches cycled; images per micro-batch "
            f"{min(frames) if frames else '?'}-{max(frames) if frames else '?'}, "
            f"vision patches per micro-batch {min(patches)}-{max(patches)}."
        )
    if config.get("vision_budgets"):
        notes.append(
            f"- Vision graphs: ours {config['vision_budgets']} patches (token budgets, at most "
            f"{config.get('vision_max_segments', '?')} frames); upstream one length of "
            f"{config.get('upstream_vision_seq_length', '?')} patches."
        )
    variants = config.get("variants") or {}
    ours = variants.get("ours") or {}
    if ours.get("status") == "ok":
        counters = ours.get("counters") or {}
        vision = counters.get("vision") or {}
        if vision:
            notes.append(
                f"- Ours, vision: {vision.get('replays', 0)} graph replays, {vision.get('eager_fallbacks', 0)} eager "
                "fallbacks over the whole run."
            )
        per_budget = ours.get("vision_graph_memory_per_budget") or {}
        if per_budget:
            parts = ", ".join(f"{b}: {fmt_bytes(m, _MIB, 0)}" for b, m in per_budget.items())
            notes.append(f"- Ours, vision graph memory per budget (MiB): {parts}.")
    for name in VARIANTS:
        v = variants.get(name) or {}
        fixed = v.get("fixed_batch") or {}
        if name != "eager" and v.get("status") == "ok" and fixed.get("grad_norm_rel_diff") is not None:
            notes.append(
                f"- {name}, fixed batch: per-token loss rel. L2 {fmt_ratio(fixed.get('loss_rel_l2'))}, "
                f"grad-norm rel. diff {_num(fixed.get('grad_norm_rel_diff')) or 0:.1e}."
            )
        for sub, err in (v.get("capture_errors") or {}).items():
            notes.append(f"- {name}: {sub} capture failed, measured without those graphs: {str(err)[:200]}")
        if v.get("gpu_busy_note"):
            notes.append(f"- {name}: {v['gpu_busy_note']}")
    return notes


def render_markdown(data: dict) -> str:
    """The whole ``bench.md`` as a string."""
    meta = data.get("meta") or {}
    configs = data.get("configs") or []
    out = ["# bridge_cudagraph benchmark: eager vs upstream graphs vs ours", ""]
    out.append(
        f"Measured on {meta.get('gpu', '?')}, {meta.get('date', '?')}; torch {meta.get('torch', '?')}, "
        f"Transformer Engine {meta.get('transformer_engine', '?')}, megatron-core {meta.get('megatron_core', '?')}, "
        f"Megatron-Bridge {meta.get('megatron_bridge', '?')}."
    )
    if meta.get("command"):
        out.append(f"Command: `{meta['command']}`.")
    out.append("")
    out.append(
        f"Each configuration trains the same weights on the same batches three ways, one after the other in one "
        f"process on one GPU (pure M4 process groups): {meta.get('warmup_steps', '?')} eager warmup steps, capture, "
        f"{meta.get('measured_steps', '?')} measured steps (median wall time, `torch.cuda.synchronize` around each "
        "step: forward/backward through Megatron's schedule plus the distributed optimizer step)."
    )
    out.append("")
    summary = []
    for config in configs:
        variants = config.get("variants") or {}
        cells = [config.get("name", "?")]
        for name in VARIANTS:
            v = variants.get(name) or {}
            if v.get("status") != "ok":
                cells.append("failed" if v else "not run")
                continue
            speed = "" if name == "eager" else f" ({fmt_ratio(v.get('speedup_vs_eager'), 'x')})"
            cells.append(fmt_ms(v.get("step_ms_median")) + speed)
        for name in ("upstream", "ours"):
            v = variants.get(name) or {}
            cells.append(fmt_diff(v.get("loss_max_abs_diff_vs_eager")) if v.get("status") == "ok" else "n/a")
        ours = variants.get("ours") or {}
        cells.append(_fmt_busy(ours) if ours.get("status") == "ok" else "n/a")
        summary.append(cells)
    if summary:
        out.append("## Summary")
        out.append("")
        out += _table(
            (
                "config",
                "eager ms",
                "upstream ms (speedup)",
                "ours ms (speedup)",
                "upstream loss diff",
                "ours loss diff",
                "ours GPU busy",
            ),
            summary,
        )
        out.append("")
        out.append("![step time per configuration and variant](bench.png)")
        out.append("")
    for config in configs:
        out.append(f"## {config.get('name', '?')}")
        out.append("")
        if config.get("description"):
            out.append(config["description"])
            out.append("")
        variants = config.get("variants") or {}
        out += _table(COLUMNS, [variant_row(name, variants.get(name)) for name in VARIANTS])
        out.append("")
        notes = _config_notes(config)
        if notes:
            out += notes
            out.append("")
    out.append("## How it is measured")
    out.append("")
    out += [
        "- **step ms**: median wall time of the measured steps; speedup = eager median / variant median.",
        "- **GPU busy**: union of the CUDA kernel intervals that `torch.profiler` (CUPTI) records in extra "
        "profiled steps after the measured ones (one per distinct micro-batch), divided by the unprofiled median "
        "wall time of the same micro-batches. "
        f"The profiler saw the kernels inside CUDA graph replays: {_yes_no(meta.get('profiler_sees_graph_kernels'))} "
        "(a probe graph of known kernels is replayed under the profiler at start). † marks a graphed variant whose "
        "busy fraction is estimated from the eager variant's kernel time instead (same kernels, fewer gaps), used "
        "when the profiler did not see its graph kernels or saw under 70% of eager's kernel time.",
        "- **capture s / graph mem**: wall time of all `create_cudagraphs()` calls and the growth of the CUDA "
        "caching allocator's reserved memory across them (graph pools and static buffers).",
        "- **peak mem**: `torch.cuda.max_memory_allocated`, reset before each variant is built (model, optimizer, "
        "capture and training steps).",
        "- **max abs loss diff vs eager**: over every step's loss (warmup, measured and profiled steps). "
        "**per-token loss diff (fixed batch)**: after the run, the initial weights are copied back into each model "
        "(graphs kept) and one fixed micro-batch's per-token loss is compared with eager's. Bold: over "
        f"DESIGN.md's bound {LOSS_BOUND:g}.",
        "- **vision ms/mb**: CUDA events per micro-batch around the vision encoder: forward (module pre/post hooks) + "
        "backward (from the gradient reaching the encoder's output to the gradient reaching its patch embedding), "
        "median over the measured steps.",
    ]
    out.append("")
    return "\n".join(out)


def _yes_no(value: Any) -> str:
    return {True: "yes", False: "no"}.get(value, "not checked")


# ---------------------------------------------------------------------------------------------- plot
def render_png(data: dict, path: Path) -> Path | None:
    """``bench.png``: one panel per configuration, one bar per variant (step ms), annotated with speedup and the
    max abs loss difference vs eager (red above the bound). None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    configs = data.get("configs") or []
    n = max(1, len(configs))
    fig, axes = plt.subplots(1, n, figsize=(3.6 * n + 0.6, 4.6), squeeze=False)
    colors = {"eager": "#9e9e9e", "upstream": "#f28e2b", "ours": "#59a14f"}
    for ax, config in zip(axes[0], configs or [{}], strict=False):
        variants = config.get("variants") or {}
        heights, labels = [], []
        for name in VARIANTS:
            v = variants.get(name) or {}
            heights.append(_num(v.get("step_ms_median")) if v.get("status") == "ok" else None)
            labels.append(name)
        top = max([h for h in heights if h is not None] or [1.0])
        for i, (name, h) in enumerate(zip(labels, heights, strict=True)):
            v = variants.get(name) or {}
            if h is None:
                ax.text(i, top * 0.05, "failed" if v else "not run", ha="center", va="bottom", fontsize=8, rotation=90)
                continue
            ax.bar(i, h, color=colors[name], width=0.7)
            lines = [f"{fmt_ms(h)} ms"]
            color = "black"
            if name != "eager":
                lines.append(fmt_ratio(v.get("speedup_vs_eager"), "x"))
                diff = _num(v.get("loss_max_abs_diff_vs_eager"))
                lines.append("Δloss " + ("0" if diff == 0 else "n/a" if diff is None else f"{diff:.1e}"))
                if diff is not None and diff > LOSS_BOUND:
                    color = "#c0392b"
            ax.text(i, h + top * 0.02, "\n".join(lines), ha="center", va="bottom", fontsize=8, color=color)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels)
        ax.set_ylim(0, top * 1.45)
        ax.set_title(config.get("name", "?"), fontsize=10)
        ax.set_ylabel("step time (ms, median)")
        ax.spines[["top", "right"]].set_visible(False)
    meta = data.get("meta") or {}
    fig.suptitle(
        f"bridge_cudagraph bench on {meta.get('gpu', '?')}: step time; Δloss = max abs loss diff vs eager "
        f"(red > {LOSS_BOUND:g})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------- entry points
def render(json_path: str | Path) -> dict[str, Path | None]:
    """Write ``bench.md`` and ``bench.png`` next to ``json_path``; returns their paths (png None without
    matplotlib)."""
    json_path = Path(json_path)
    data = json.loads(json_path.read_text())
    md = json_path.with_name("bench.md")
    md.write_text(render_markdown(data))
    png = render_png(data, json_path.with_name("bench.png"))
    return {"md": md, "png": png}


def merge(paths: Sequence[str | Path], out_dir: str | Path) -> Path:
    """Join several ``bench.json`` into ``out_dir/bench.json`` (a later file's configuration replaces an earlier
    one of the same name), render it, and return the path."""
    merged: dict[str, Any] = {"meta": {}, "configs": []}
    by_name: dict[str, int] = {}
    runs = []
    for p in paths:
        data = json.loads(Path(p).read_text())
        meta = data.get("meta") or {}
        if not merged["meta"]:
            merged["meta"] = dict(meta)
        runs.append({k: meta.get(k) for k in ("command", "date", "gpu")})
        for config in data.get("configs") or []:
            name = config.get("name")
            if name in by_name:
                merged["configs"][by_name[name]] = config
            else:
                by_name[name] = len(merged["configs"])
                merged["configs"].append(config)
    merged["meta"]["merged_from"] = runs
    if len(runs) > 1:
        merged["meta"]["command"] = " ; ".join(str(r.get("command")) for r in runs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = out / "bench.json"
    target.write_text(json.dumps(merged, indent=2))
    render(target)
    return target


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bridge_cudagraph.bench_report", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("render", help="write bench.md and bench.png next to a bench.json")
    r.add_argument("json_path")
    m = sub.add_parser("merge", help="join several bench.json files into OUT/bench.json and render it")
    m.add_argument("json_paths", nargs="+")
    m.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.command == "render":
        paths = render(args.json_path)
    else:
        target = merge(args.json_paths, args.out)
        paths = {"json": target, "md": target.with_name("bench.md"), "png": target.with_name("bench.png")}
    for key, path in paths.items():
        print(f"{key}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
