#!/usr/bin/env bash
# Device call of run 42 (2026-12-01, session 13, issue #18): the 2B shape the issue's targets are judged on
# (micro-batch 1, sequence 2048) once more, now with the control (eager trained again: the noise floor the drift is
# judged against): eager, upstream, ours, ours_fused, the paired phase upstream vs ours_fused and the lever pair ours
# vs ours_fused. Run 40 measured the same without the control.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run42.sh
set +e
export LOGS=/tmp/dl_run42
source scripts/device_lib.sh
prologue
R b1_fused_2b_control 330 "python3 -m benchmarks.bench --out \$LOGS/bench_2b --configs small-mbs1-seq2048 --variants eager,upstream,ours,ours_fused --paired-with ours_fused --lever-pairs ours:ours_fused"
python3 - <<'PY'
import json, os, statistics
path = os.path.join(os.environ["LOGS"], "bench_2b", "bench.json")
if os.path.exists(path):
    for c in json.load(open(path))["configs"]:
        for v, r in c["variants"].items():
            print(f"{v:24s} {r.get('status')} step {r.get('step_ms_median') or 0:8.2f} kern {r.get('kernel_ms_per_step') or 0:7.2f} busy {r.get('gpu_busy_in_profiled_steps') or 0:.2f} fixed {(r.get('fixed_batch') or {}).get('loss_max_abs_diff')} run {r.get('loss_max_abs_diff_vs_eager')}")
        for p in [c.get("paired") or {}, *(c.get("lever_pairs") or [])]:
            r = p.get("ratios") or []
            print("paired", p.get("variants"), p.get("status"), p.get("step_ms_median"), "median ratio", statistics.median(r) if r else None, p.get("error"))
PY
grep -n "noise floor\|vs the noise floor" "$LOGS"/bench_2b/bench.md | cut -c1-300
table
