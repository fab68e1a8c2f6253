#!/usr/bin/env bash
# Device call of run 38 (2026-12-01, session 12, issue #18): three host levers from run 37's stacks. The test harness
# sets a model's finalisation up once (it walked every module twice per step); megatron-core's module walk at the end
# of finalize_model_grads runs on a list made once (bridge_cudagraph.finalize_host); the chained optimizer's clip and
# norm use the members' cached lists (CachedChainedStep). First the GPU checks, side by side (tiny models): the
# optimizer cache bit for bit against megatron-core's step (now with the chained step), the vision suite again (its
# fallback floor now also samples after the capture), and Bridge's loop (the callback puts both caches on; losses
# identical to graphs off; resume). Then the benchmark alone on the GPU, 2B shape, with the control: eager, upstream,
# ours, ours_plain_optimizer, ours_walking_finalize, the paired phase upstream vs ours and two lever pairs.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run38.sh
set +e
export LOGS=/tmp/dl_run38
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=5'
( R t1_optimizer_host 100 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_optimizer_host.json $PYT tests/gpu/test_optimizer_host_step.py"
  R t3_vision 150 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_vision.json $PYT tests/gpu/test_vision_capture.py" ) &
( R t2_bridge_loop 240 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_loop.json $PYT tests/gpu/test_bridge_loop.py" ) &
wait
R b1_levers_2b 360 "python3 -m benchmarks.bench --out \$LOGS/bench_2b --configs small-mbs1-seq2048 --variants eager,upstream,ours,ours_plain_optimizer,ours_walking_finalize --paired-with ours --lever-pairs ours_walking_finalize:ours,ours_plain_optimizer:ours"
python3 - <<'PY'
import json, os, statistics
path = os.path.join(os.environ["LOGS"], "bench_2b", "bench.json")
if os.path.exists(path):
    for c in json.load(open(path))["configs"]:
        for v, r in c["variants"].items():
            print(f"{v:24s} {r.get('status')} step {r.get('step_ms_median') or 0:8.2f} kern {r.get('kernel_ms_per_step') or 0:7.2f} busy {r.get('gpu_busy_in_profiled_steps') or 0:.2f} fixed {(r.get('fixed_batch') or {}).get('loss_max_abs_diff')} run {r.get('loss_max_abs_diff_vs_eager')}")
        for p in [c.get("paired") or {}, *(c.get("lever_pairs") or [])]:
            r = p.get("ratios") or []
            print("paired", p.get("variants"), p.get("status"), p.get("step_ms_median"), "median ratio", statistics.median(r) if r else None, p.get("ci95"), p.get("error"))
PY
grep -E "passed|failed|error" $LOGS/t*.log | tail -8
table
