#!/usr/bin/env bash
# Device call of run 41 (2026-12-01, session 13, issue #18). First, under TE's deterministic kernels, the packed (THD)
# language graphs with model.gradient_accumulation_fusion=true bit for bit against the plugin's graphs-off model and
# Bridge's unmodified one with TE's fusion on in the same modules (and the two unfused cases again). Then, alone on
# the GPU: the 2B configuration run 39 did not rerun (micro-batch 2, sequence 4096): eager, upstream, ours,
# ours_fused, the paired phase upstream vs ours_fused and the lever pair ours vs ours_fused, no control; then the
# useful-tokens benchmark of the packed-sequence issue at run 15's settings with every lever since (2B shape, Bridge's
# photo data path, packed and padded).
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run41.sh
set +e
export LOGS=/tmp/dl_run41
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=5'
R t1_packed_fused 110 "NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed_fused.json $PYT tests/gpu/test_packed_language.py -k match_eager_and_bridge"
R b1_mbs2_seq4096 250 "python3 -m benchmarks.bench --out \$LOGS/bench_4096 --configs small-mbs2-seq4096 --no-control --variants eager,upstream,ours,ours_fused --paired-with ours_fused --lever-pairs ours:ours_fused"
R u1_useful_small 225 "BRIDGE_CUDAGRAPH_CACHE=/tmp/bcg_cache_ut python3 -m benchmarks.useful_tokens --out \$LOGS/ut_small --model small --seq 4096 --mbs 2 --num-mb 2 --steps 12"
python3 - <<'PY'
import json, os, statistics
path = os.path.join(os.environ["LOGS"], "bench_4096", "bench.json")
if os.path.exists(path):
    for c in json.load(open(path))["configs"]:
        for v, r in c["variants"].items():
            print(f"{v:24s} {r.get('status')} step {r.get('step_ms_median') or 0:8.2f} kern {r.get('kernel_ms_per_step') or 0:7.2f} busy {r.get('gpu_busy_in_profiled_steps') or 0:.2f} fixed {(r.get('fixed_batch') or {}).get('loss_max_abs_diff')} run {r.get('loss_max_abs_diff_vs_eager')}")
        for p in [c.get("paired") or {}, *(c.get("lever_pairs") or [])]:
            r = p.get("ratios") or []
            print("paired", p.get("variants"), p.get("status"), p.get("step_ms_median"), "median ratio", statistics.median(r) if r else None, p.get("error"))
PY
tail -n 25 "$LOGS"/ut_small/useful_tokens.md 2>/dev/null | cut -c1-250
table
