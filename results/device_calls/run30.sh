#!/usr/bin/env bash
# Device call of run 30 (2026-12-01, session 10, issue #18): the two levers' GPU tests (the vision encoder as one
# graph per budget vs one per layer, bit-exact against eager; Bridge's optimizer graph composed with ours over 30
# steps, deterministic), the whole vision suite on the new default, the benchmark's lever variants on the tiny shape,
# then the levers alone on the 2B shape (micro-batch 1, sequence 2048) with the host-sync census.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run30.sh
set +e
export LOGS=/tmp/dl_run30
source scripts/device_lib.sh
prologue
DET=NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=5'
LEVERS=eager,upstream,ours,ours_per_layer,ours_optgraph
( R t1_optimizer_graph_det 150 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_optimizer_graph_det.json $PYT tests/gpu/test_optimizer_graph.py"
  R t3_bench_tiny 150 "python3 -m benchmarks.bench --out \$LOGS/bench_tiny --configs tiny --variants $LEVERS --no-control --paired-with ours_optgraph --measured-steps 10" ) &
( R t2_vision 240 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_vision.json $PYT tests/gpu/test_vision_capture.py" ) &
wait
R b1_levers_2b 330 "python3 -m benchmarks.bench --out \$LOGS/bench_2b --configs small-mbs1-seq2048 --variants ours,ours_per_layer,ours_optgraph --no-control --no-paired --measured-steps 20"
python3 - <<'PY'
import json, os
for name in ("bench_tiny", "bench_2b"):
    path = os.path.join(os.environ["LOGS"], name, "bench.json")
    if not os.path.exists(path):
        print(name, "no bench.json"); continue
    for c in json.load(open(path))["configs"]:
        for v, r in c["variants"].items():
            print(f"{c['name']:20s} {v:16s} {r.get('status')} step {r.get('step_ms_median') or 0:8.2f} kern {r.get('kernel_ms_per_step') or 0:7.2f} busy {r.get('gpu_busy_in_profiled_steps') or 0:.2f} mfu {r.get('mfu') or 0:.3f} syncs {(r.get('host_syncs') or {}).get('total')} fixed {(r.get('fixed_batch') or {}).get('loss_max_abs_diff')}")
        print(" paired", (c.get("paired") or {}).get("status"), (c.get("paired") or {}).get("step_ms_median"))
PY
table
