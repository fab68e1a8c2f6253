#!/usr/bin/env bash
# Device call of run 39 (2026-12-01, session 12, issue #18): the benchmark with every lever of this session, alone on
# the GPU. First the 2B shape the issue's targets are judged on (micro-batch 1, sequence 2048) with the control and
# the paired phase: eager, upstream, ours (both step host caches, the chained step, the host-built vision segments).
# Then two more 2B configurations ("no configuration slower than before": micro-batch 2 / sequence 2048 and
# micro-batch 1 / sequence 4096), eager, upstream and ours with the paired phase, no control. Each run writes its
# bench.json after every configuration, so what finishes before the limit is kept.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run39.sh
set +e
export LOGS=/tmp/dl_run39
source scripts/device_lib.sh
prologue
R b1_main_2b 200 "python3 -m benchmarks.bench --out \$LOGS/bench_2b --configs small-mbs1-seq2048 --variants eager,upstream,ours"
R b2_more_2b 330 "python3 -m benchmarks.bench --out \$LOGS/bench_more --configs small-mbs2-seq2048,small-mbs1-seq4096 --no-control --variants eager,upstream,ours"
python3 - <<'PY'
import json, os, statistics
for sub in ("bench_2b", "bench_more"):
    path = os.path.join(os.environ["LOGS"], sub, "bench.json")
    if not os.path.exists(path):
        print(sub, "no bench.json"); continue
    for c in json.load(open(path))["configs"]:
        for v, r in c["variants"].items():
            print(f"{c['name']:20s} {v:14s} {r.get('status')} step {r.get('step_ms_median') or 0:8.2f} kern {r.get('kernel_ms_per_step') or 0:7.2f} busy {r.get('gpu_busy_in_profiled_steps') or 0:.2f} fixed {(r.get('fixed_batch') or {}).get('loss_max_abs_diff')} run {r.get('loss_max_abs_diff_vs_eager')}")
        p = c.get("paired") or {}
        r = p.get("ratios") or []
        print("paired", c["name"], p.get("status"), p.get("step_ms_median"), "median ratio", statistics.median(r) if r else None, p.get("error"))
PY
table
