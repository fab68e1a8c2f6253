#!/usr/bin/env bash
# Device call of run 43 (2026-12-02, session 14, issue #18): Qwen3-VL's forward with fewer host waits
# (bridge_cudagraph/forward_host.py). Its GPU tests under deterministic kernels, two lanes at once (tiny models):
# bit for bit against Bridge's unmodified model with the waits counted, and the packed graphs with it; then the 2B
# shape the issue's targets are judged on (micro-batch 1, sequence 2048): eager, upstream, ours, ours_fused and
# ours_fused_host_waits (Bridge's forward as it is), the control, the paired phase upstream vs ours_fused and the
# lever pair ours_fused_host_waits vs ours_fused.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run43.sh
set +e
export LOGS=/tmp/dl_run43
source scripts/device_lib.sh
prologue
export NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
( R t1_reference_waits 170 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_reference_waits.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_bridge_reference.py -k 'host_waits or wait_at_most'" ) &
( R t2_packed_waits 170 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed_waits.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_packed_language.py -k fewer_waits" ) &
wait
unset NVTE_ALLOW_NONDETERMINISTIC_ALGO
R b1_waits_2b 380 "python3 -m benchmarks.bench --out \$LOGS/bench_2b --configs small-mbs1-seq2048 --variants eager,upstream,ours,ours_fused,ours_fused_host_waits --paired-with ours_fused --lever-pairs ours_fused_host_waits:ours_fused"
python3 - <<'PY'
import json, os, statistics
for f in ("gpu_reference_waits.json", "gpu_packed_waits.json"):
    path = os.path.join(os.environ["LOGS"], f)
    if os.path.exists(path):
        for row in json.load(open(path)):
            if "waits" in json.dumps(row) or "host" in json.dumps(row):
                print(f, json.dumps(row)[:300])
path = os.path.join(os.environ["LOGS"], "bench_2b", "bench.json")
if os.path.exists(path):
    for c in json.load(open(path))["configs"]:
        for v, r in c["variants"].items():
            print(f"{v:24s} {r.get('status')} step {r.get('step_ms_median') or 0:8.2f} kern {r.get('kernel_ms_per_step') or 0:7.2f} busy {r.get('gpu_busy_in_profiled_steps') or 0:.2f} fixed {(r.get('fixed_batch') or {}).get('loss_max_abs_diff')} run {r.get('loss_max_abs_diff_vs_eager')}")
        for p in [c.get("paired") or {}, *(c.get("lever_pairs") or [])]:
            r = p.get("ratios") or []
            print("paired", p.get("variants"), p.get("status"), p.get("step_ms_median"), "median ratio", statistics.median(r) if r else None, p.get("error"))
PY
grep -n "noise floor\|host waits on the GPU" "$LOGS"/bench_2b/bench.md | cut -c1-300
table
