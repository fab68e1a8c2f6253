"""Every number the stored runs' reports gave, still given: the 27 ``useful_tokens.json`` under ``results/`` rendered
by the benchmark code of two trees, and each old rendering's numbers looked for in the new one's.

``python results/benchmark-harness/number_check.py BEFORE AFTER OUT`` (run from the checkout's root; ``BEFORE`` and
``AFTER`` hold ``benchmarks/`` and ``bridge_cudagraph/``, e.g. ``git archive c2c7ead | tar -x -C BEFORE``) renders
each JSON's markdown and stdout table under ``OUT/before`` and ``OUT/after`` (a child process per tree, that tree
first on its path), with the verdicts the harness derives from a run (failed variants, summary, speed-ups, the paired
verdict, per variant step / kernel, kernel time missed, counter problems, gradient parity, loss difference). Exit 0
where the multiset of numbers of every old rendering is contained in the new one's (a number not glued to a word
before it, with its ``x`` or ``%``) and every verdict is equal; else 1, with what is missing.
"""

from __future__ import annotations

import collections
import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

#: A number not glued to a word before it (Qwen3, fp32 and H100 are names), with its ``x`` or ``%``.
NUMBER = re.compile(r"(?<![A-Za-z_\d.])-?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?(?:x|%)?")


def stored_runs() -> list[Path]:
    """Every stored ``useful_tokens.json`` of the checkout, in path order."""
    return sorted(Path("results").rglob("useful_tokens.json"))


def dump(out: Path) -> None:
    """Render every stored run with the benchmark code on this process's path, and write its verdicts."""
    from benchmarks import report
    from benchmarks.useful_tokens import failed_variants

    out.mkdir(parents=True, exist_ok=True)
    verdicts = {}
    for index, path in enumerate(stored_runs()):
        data = json.loads(path.read_text())
        (out / f"{index:02d}.md").write_text(report.render_markdown(copy.deepcopy(data)))
        (out / f"{index:02d}.txt").write_text(report.text_table(copy.deepcopy(data)))
        finished = report.finish(copy.deepcopy(data))
        variants = data.get("variants") or {}
        paired = data.get("paired") or {}
        verdicts[str(path)] = {
            "failed": failed_variants(data),
            "summary": finished["summary"],
            "speedups": {name: rec.get("speedup_vs_eager_packed") for name, rec in finished["variants"].items()},
            "paired": report.paired_verdict(paired["ratios"]) if paired.get("ratios") else None,
            "per_variant": {name: _variant_verdicts(report, rec) for name, rec in variants.items()},
        }
    (out / "verdicts.json").write_text(json.dumps(verdicts, indent=1, sort_keys=True, default=list))


def _variant_verdicts(report, rec: dict) -> dict:
    fixed = (rec.get("parity") or {}).get("fixed_batch") or {}
    return {
        "step_over_kernel": report.step_over_kernel(rec),
        "kernel_time_missed": report.kernel_time_missed(rec),
        "counter_problems": report.counter_problems(rec.get("counters") or {}),
        "grad_parity": report.fmt_grad_parity(fixed) if fixed else None,
        "loss_diff": report.fmt_diff(fixed.get("loss_max_abs")) if fixed else None,
    }


def numbers(text: str) -> collections.Counter:
    """The multiset of :data:`NUMBER` in ``text``."""
    return collections.Counter(match.group(0).rstrip(",") for match in NUMBER.finditer(text))


def compare(before: Path, after: Path) -> int:
    """Print what of ``before``'s renderings and verdicts ``after`` lacks; the count of problems."""
    problems = 0
    renderings = sorted([*before.glob("*.md"), *before.glob("*.txt")])
    for old in renderings:
        missing = numbers(old.read_text()) - numbers((after / old.name).read_text())
        if missing:
            problems += 1
            print(f"{old.name}: missing {dict(missing)}")
    old_verdicts, new_verdicts = (json.loads((d / "verdicts.json").read_text()) for d in (before, after))
    for run, verdict in old_verdicts.items():
        if verdict != new_verdicts.get(run):
            problems += 1
            print(f"{run}: verdicts differ")
    print(f"{len(renderings)} renderings of {len(old_verdicts)} runs: {problems} with a number or verdict missing")
    return problems


def main(before_root: str, after_root: str, out: str) -> int:
    """Dump both trees' renderings under ``out``, then compare them: 1 where anything is missing."""
    for name, root in (("before", before_root), ("after", after_root)):
        env = {**os.environ, "PYTHONPATH": str(Path(root).resolve())}
        subprocess.run([sys.executable, "-P", __file__, "--dump", str(Path(out) / name)], env=env, check=True)
    return 1 if compare(Path(out) / "before", Path(out) / "after") else 0


if __name__ == "__main__":
    if sys.argv[1] == "--dump":
        dump(Path(sys.argv[2]))
    else:
        sys.exit(main(*sys.argv[1:4]))
