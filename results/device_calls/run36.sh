#!/usr/bin/env bash
# Device call of run 36 (2026-12-01, session 11, issue #18): two more host levers. The optimizer host cache now also
# takes the clip's and zero_grad's per-parameter walks (bridge_cudagraph.optimizer_host), and the vision encoder keeps
# the position indices, weights and rotary rows per image size (bridge_cudagraph.vision_positions). First the GPU
# checks, side by side (tiny models): the optimizer cache's bit-for-bit test, the vision graph suite (graphs vs
# Bridge's eager encoder, bit-exact), and Bridge's training loop (callback path: cache counts, losses identical to
# graphs off, resume). Then the benchmark alone on the GPU, 2B shape: eager, upstream, ours, ours_plain_optimizer,
# ours_uncached_positions (no control: the paired phases are the comparisons), the paired phase upstream vs ours and
# the lever pairs ours_plain_optimizer vs ours and ours_uncached_positions vs ours.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run36.sh
set +e
export LOGS=/tmp/dl_run36
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=5'
( R t1_optimizer_host 150 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_optimizer_host.json $PYT tests/gpu/test_optimizer_host.py"
  R t3_vision 200 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_vision.json $PYT tests/gpu/test_vision_capture.py" ) &
( R t2_bridge_loop 300 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_loop.json $PYT tests/gpu/test_bridge_loop.py" ) &
wait
R b1_levers_2b 360 "python3 -m benchmarks.bench --out \$LOGS/bench_2b --configs small-mbs1-seq2048 --no-control --variants eager,upstream,ours,ours_plain_optimizer,ours_uncached_positions --paired-with ours --lever-pairs ours_plain_optimizer:ours,ours_uncached_positions:ours"
python3 - <<'PY'
import json, os, statistics
path = os.path.join(os.environ["LOGS"], "bench_2b", "bench.json")
if os.path.exists(path):
    for c in json.load(open(path))["configs"]:
        for v, r in c["variants"].items():
            print(f"{v:24s} {r.get('status')} step {r.get('step_ms_median') or 0:8.2f} kern {r.get('kernel_ms_per_step') or 0:7.2f} busy {r.get('gpu_busy_in_profiled_steps') or 0:.2f} fixed {(r.get('fixed_batch') or {}).get('loss_max_abs_diff')}")
        for p in [c.get("paired") or {}, *(c.get("lever_pairs") or [])]:
            r = p.get("ratios") or []
            print("paired", p.get("variants"), p.get("status"), p.get("step_ms_median"), "median ratio", statistics.median(r) if r else None, p.get("error"))
PY
grep -E "passed|failed|error" $LOGS/t*.log | tail -8
table
