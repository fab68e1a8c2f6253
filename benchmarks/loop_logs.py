"""Compare Bridge ``pretrain()`` runs by their logs: per-iteration loss and grad norm, NaN-safe.

``python -m benchmarks.loop_logs --out X.json --reference eager.log [--floor eager_again.log] [--from-iteration N]
LOG ...``: "identical" means at the printed precision. With ``--floor`` (a second eager run) every run is a graphed
run that must stay finite, within ``FLOOR_FACTOR`` times the floor, with graphs and replays in every submodule, else
exit 1."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from bridge_cudagraph.testing.parity import FLOOR_FACTOR, capture_problems, compare_series, noise_floor

_NUMBER = r"([-+0-9.eEnaif]+)"
ITERATION = re.compile(rf"iteration\s+(\d+)/\s*\d+ \|.*?lm loss: {_NUMBER} \|.*?grad norm: {_NUMBER} \|")
CAPTURE = re.compile(r"bridge_cudagraph \[iteration (\d+)\] (.*)")


def read_log(path: str | Path) -> dict:
    """Per-iteration ``loss`` and ``grad_norm`` (dicts keyed by iteration) and the last capture summary line."""
    losses, norms, summary = {}, {}, None
    for line in Path(path).read_text(errors="replace").splitlines():
        if m := ITERATION.search(line):
            losses[int(m.group(1))] = float(m.group(2))
            norms[int(m.group(1))] = float(m.group(3))
        elif m := CAPTURE.search(line):
            summary = m.group(2).strip()
    return {"loss": losses, "grad_norm": norms, "capture": summary}


def compare(run: dict, reference: dict, first: int) -> dict:
    """Both series of ``run`` against ``reference`` over the run's iterations from ``first`` on."""
    out = {}
    for key in ("loss", "grad_norm"):
        steps = sorted(i for i in run[key] if i >= first)
        if any(i not in reference[key] for i in steps):
            raise ValueError(f"{key}: the reference lacks iterations {[i for i in steps if i not in reference[key]]}")
        d = compare_series([run[key][i] for i in steps], [reference[key][i] for i in steps], name=key)
        first_diff = next((i for i in steps if run[key][i] != reference[key][i]), None)
        out[key] = {
            "iterations": [steps[0], steps[-1]] if steps else [],
            "identical_at_printed_precision": d.steps == d.exact_steps and not d.nonfinite_steps,
            "exact_steps": d.exact_steps,
            "steps": d.steps,
            "first_different_iteration": first_diff,
            "max_abs": d.max_abs,
            "max_rel": d.max_rel,
            "nonfinite_steps": list(d.nonfinite_steps),
        }
    return out


def noise_floors(eager_again: dict, reference: dict, first: int) -> dict[str, float]:
    """Per series, the largest difference between two eager runs (NaN-safe: a non-finite step raises)."""
    out = {}
    for key in ("loss", "grad_norm"):
        steps = sorted(i for i in reference[key] if i >= first)
        if sorted(i for i in eager_again[key] if i >= first) != steps:
            raise ValueError(f"{key}: the floor run and the reference logged different iterations")
        out[key] = noise_floor([[reference[key][i] for i in steps], [eager_again[key][i] for i in steps]], name=key)
    return out


def capture_counts(summary: str | None) -> dict[str, dict[str, int]]:
    """The callback's summary line (``language: graphs=52 replays=54 ... | vision: ...``) as counters per submodule."""
    counts: dict[str, dict[str, int]] = {}
    for part in (summary or "").split("|"):
        submodule, _, values = part.partition(":")
        if values:
            counts[submodule.strip()] = {k: int(v) for k, v in (kv.split("=") for kv in values.split())}
    return counts


def replay_problems(summary: str | None) -> list[str]:
    """What is wrong with a graphed run's last capture summary: none, or a submodule without graphs or replays."""
    counts = capture_counts(summary)
    if not counts:
        return ["no capture summary in the log: not a graphed run"]
    return [problem for sub, stats in counts.items() for problem in capture_problems(stats, where=sub)]


def within_floor(row: dict, floors: dict[str, float]) -> bool:
    """Both series finite and within ``FLOOR_FACTOR`` times the eager floor, and the graphs captured and replayed."""
    return not row["capture_problems"] and all(
        not row[key]["nonfinite_steps"] and row[key]["max_abs"] <= FLOOR_FACTOR * floors[key] for key in floors
    )


def main(argv=None) -> int:
    """Compare every given log with the reference; write the JSON; print one line per run."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--reference", required=True, help="the log every other run is compared with")
    p.add_argument("--from-iteration", type=int, default=1, help="compare from this iteration on (resumed runs)")
    p.add_argument("--floor", help="a second eager run of the reference's configuration: the noise floor")
    p.add_argument("logs", nargs="+")
    args = p.parse_args(argv)
    reference = read_log(args.reference)
    floors = None if args.floor is None else noise_floors(read_log(args.floor), reference, args.from_iteration)
    rows = {}
    for log in args.logs:
        run = read_log(log)
        r = rows[Path(log).name] = {**compare(run, reference, args.from_iteration), "capture": run["capture"]}
        if floors is not None:
            r["capture_problems"] = replay_problems(run["capture"])
            r["within_floor"] = within_floor(r, floors)
        print(
            f"{Path(log).name:28s} loss identical={r['loss']['identical_at_printed_precision']} "
            f"first diff={r['loss']['first_different_iteration']} max abs={r['loss']['max_abs']:.3g} | "
            f"grad norm identical={r['grad_norm']['identical_at_printed_precision']}"
            + ("" if floors is None else f" | within {FLOOR_FACTOR:g}x the eager floor={r['within_floor']}")
        )
    result = {"reference": Path(args.reference).name, "from_iteration": args.from_iteration, "runs": rows}
    if floors is not None:
        result |= {"floor_log": Path(args.floor).name, "floor": floors, "floor_factor": FLOOR_FACTOR}
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0 if floors is None or all(r["within_floor"] for r in rows.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
