"""The product's real loop, graphs on and off, one run after another: ``bridge-cudagraph train`` on a recipe.

Reads the end-of-training lines ``train`` prints (useful tokens/s, data wait, peak memory) off each run's log; writes
``OUT/real_loop.json``, ``.md`` and the logs. A failed run is a row with its exit code and last ``error:`` line."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["Run", "Variant", "main", "parse_log", "plan_runs", "render_table", "train_command"]

#: The overrides of the ``eager`` variant (``graphs``: the recipe's block as it is).
GRAPHS_OFF = ("model.cuda_graph.language.enabled=false", "model.cuda_graph.vision.enabled=false")

_RATE = re.compile(
    r"bridge_cudagraph: useful tokens/s ([\d,]+) \(tokens with loss over (\d+) measured training steps, "
    r"([\d.]+) s; end of training"
)
_WAIT = re.compile(r"bridge_cudagraph: data wait ([\d.]+) ms of ([\d.]+) ms per step \(([\d.]+)%.*end of training")
_PEAK = re.compile(r"bridge_cudagraph: peak memory ([\d.]+) GiB allocated / ([\d.]+) GiB reserved")
_BOUND = "bridge_cudagraph: the data is the limit"


@dataclass(frozen=True)
class Variant:
    """Graphs on or off, with a DataLoader worker count (None: the recipe's)."""

    graphs: bool
    workers: int | None = None

    @property
    def name(self) -> str:
        return ("graphs" if self.graphs else "eager") + ("" if self.workers is None else f"_w{self.workers}")

    def overrides(self) -> tuple[str, ...]:
        workers = () if self.workers is None else (f"dataset.num_workers={self.workers}",)
        return (() if self.graphs else GRAPHS_OFF) + workers


@dataclass
class Run:
    """One run's numbers, read off its log (None: the line was not printed)."""

    variant: str
    graphs: bool
    workers: int | None
    repeat: int
    exit_code: int
    seconds: float
    useful_tokens_per_s: float | None = None
    measured_steps: int | None = None
    step_ms: float | None = None
    data_wait_ms: float | None = None
    data_wait_share: float | None = None
    data_bound: bool = False
    peak_allocated_gib: float | None = None
    peak_reserved_gib: float | None = None
    error: str | None = None
    log: str = ""
    command: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """What fails a finished graphed run: a submodule without graphs or replays, or a non-finite step."""
    loss_vs_eager: dict | None = None
    """Its loss and grad norm against the eager run of the same workers and repeat (:func:`loop_logs.compare`)."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.useful_tokens_per_s is not None and not self.problems


def train_command(recipe: str, iters: int, variant: Variant) -> list[str]:
    """The user's command: ``python -m bridge_cudagraph train RECIPE`` with the variant's overrides."""
    head = [sys.executable, "-m", "bridge_cudagraph", "train", recipe]
    return [*head, f"train.train_iters={iters}", *variant.overrides()]


def plan_runs(variants: list[Variant], repeats: int) -> list[tuple[Variant, int]]:
    """Every variant once per repeat, the variants alternating (A B A B)."""
    return [(v, r) for r in range(repeats) for v in variants]


def parse_log(text: str) -> dict:
    """The end-of-training numbers ``train`` printed, or the run's last ``error:`` line."""
    out: dict = {}
    if (m := _last(_RATE, text)) is not None:
        out["useful_tokens_per_s"] = float(m.group(1).replace(",", ""))
        out["measured_steps"] = int(m.group(2))
        out["step_ms"] = 1e3 * float(m.group(3)) / int(m.group(2)) if int(m.group(2)) else None
    if (m := _last(_WAIT, text)) is not None:
        out["data_wait_ms"], out["data_wait_share"] = float(m.group(1)), float(m.group(3)) / 100
    if (m := _last(_PEAK, text)) is not None:
        out["peak_allocated_gib"], out["peak_reserved_gib"] = float(m.group(1)), float(m.group(2))
    out["data_bound"] = _BOUND in text
    if errors := [line.strip() for line in text.splitlines() if line.startswith("error:")]:
        out["error"] = errors[-1][:300]
    return out


def _last(pattern: re.Pattern, text: str) -> re.Match | None:
    found = list(pattern.finditer(text))
    return found[-1] if found else None


def run_one(recipe: str, iters: int, variant: Variant, repeat: int, out: Path, port: int, timeout: float) -> Run:
    """One ``train`` run in a process of its own, its log under ``out``."""
    command = train_command(recipe, iters, variant)
    env = {**os.environ, "MASTER_ADDR": os.environ.get("MASTER_ADDR", "127.0.0.1"), "MASTER_PORT": str(port)}
    log = out / f"{variant.name}_r{repeat}.log"
    start = time.perf_counter()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        code, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        code = 124
        # TimeoutExpired carries the output so far as bytes.
        text = f"{_decoded(expired.stdout)}{_decoded(expired.stderr)}\nerror: timed out after {timeout:.0f} s"
    seconds = time.perf_counter() - start
    log.write_text(text)
    numbers = parse_log(log.read_text())
    return Run(
        variant.name, variant.graphs, variant.workers, repeat, code, seconds, **numbers, log=log.name, command=command
    )


def _decoded(output: bytes | str | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def check_against_eager(runs: list[Run], out: Path) -> None:
    """Each finished graphed run's :attr:`Run.problems` and :attr:`Run.loss_vs_eager`, from the logs under ``out``."""
    from benchmarks.loop_logs import compare, read_log, replay_problems

    logs = {(r.graphs, r.workers, r.repeat): read_log(out / r.log) for r in runs if r.exit_code == 0}
    for r in runs:
        if not r.graphs or (True, r.workers, r.repeat) not in logs:
            continue
        graphed = logs[(True, r.workers, r.repeat)]
        r.problems = replay_problems(graphed["capture"])
        bad = sorted(i for key in ("loss", "grad_norm") for i, v in graphed[key].items() if not math.isfinite(v))
        if bad:
            r.problems.append(f"non-finite loss or grad norm at iterations {bad[:5]}")
        eager = logs.get((False, r.workers, r.repeat))
        if eager is not None and graphed["loss"] and not bad:
            r.loss_vs_eager = compare(graphed, eager, first=min(graphed["loss"]))


def render_table(runs: list[Run]) -> str:
    """The markdown table: one row per run, x against the median of the eager runs of the same workers."""
    base: dict[int | None, list[float]] = {}
    for r in runs:
        if r.ok and not r.graphs and r.useful_tokens_per_s is not None:
            base.setdefault(r.workers, []).append(r.useful_tokens_per_s)
    rows = [
        "| variant | repeat | useful tok/s | x eager | step ms | data wait ms (share) | peak GiB alloc / reserved | "
        "loss vs eager, max rel | exit |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        if not r.ok:
            why = "; ".join(r.problems) or r.error or "no end-of-training line"
            rows.append(f"| {r.variant} | {r.repeat} | failed: {why} | | | | | | {r.exit_code} |")
            continue
        assert r.useful_tokens_per_s is not None  # r.ok
        ref = sorted(base.get(r.workers, []))
        ratio = f"{r.useful_tokens_per_s / ref[len(ref) // 2]:.2f}x" if ref else "n/a"
        share = r.data_wait_share
        wait = "n/a" if r.data_wait_ms is None or share is None else f"{r.data_wait_ms:.1f} ({100 * share:.0f}%)"
        peak = "n/a" if r.peak_allocated_gib is None else f"{r.peak_allocated_gib:.1f} / {r.peak_reserved_gib:.1f}"
        loss = "" if r.loss_vs_eager is None else f"{r.loss_vs_eager['loss']['max_rel']:.2e}"
        rows.append(
            f"| {r.variant} | {r.repeat} | {r.useful_tokens_per_s:,.0f} | {ratio} | {r.step_ms:.1f} | {wait}"
            f"{' data-bound' if r.data_bound else ''} | {peak} | {loss} | {r.exit_code} |"
        )
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run every variant, write the JSON and the table; exit 1 where a run failed or a graphed run did not replay."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.real_loop", description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--workers", default="", help="DataLoader worker counts, comma-separated (default: recipe's)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--port", type=int, default=29700)
    args = parser.parse_args(argv)
    counts: list[int | None] = [int(w) for w in args.workers.split(",") if w.strip()] or [None]
    variants = [Variant(graphs, w) for w in counts for graphs in (True, False)]
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    runs = []
    for i, (variant, repeat) in enumerate(plan_runs(variants, args.repeats)):
        run = run_one(args.recipe, args.iters, variant, repeat, args.out, args.port + i, args.timeout)
        print(
            f"[real_loop] {variant.name} r{repeat}: exit {run.exit_code}, {run.useful_tokens_per_s} useful tok/s, "
            f"data wait {run.data_wait_share}, {run.seconds:.0f} s",
            flush=True,
        )
        runs.append(run)
    check_against_eager(runs, args.out)
    from benchmarks.runner import command_line, run_meta  # after the runs: CUDA initialised here

    meta = run_meta(command_line("benchmarks.real_loop", argv), date=started)
    record = {"meta": meta, "recipe": args.recipe, "iters": args.iters, "runs": [asdict(r) for r in runs]}
    (args.out / "real_loop.json").write_text(json.dumps(record, indent=1))
    table = render_table(runs)
    (args.out / "real_loop.md").write_text(table)
    print(table)
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
