#!/usr/bin/env bash
# Device call of run 31 (2026-12-01, session 10, issue #18): why the whole-encoder vision graph moved some gradients
# in run 30 (benchmarks.vision_unit_probe: every unit, with and without deterministic kernels), the vision test on
# the three units, the optimizer-graph test (its assertion of capture ran after the graphs were deleted in run 30),
# and the 2B shape's ours vs ours_optgraph with the kernels and the longest GPU-idle gaps of the profiled steps.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run31.sh
set +e
export LOGS=/tmp/dl_run31
source scripts/device_lib.sh
prologue
DET=NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=5'
( R p1_units 120 "python3 -m benchmarks.vision_unit_probe > \$LOGS/vision_units.json"
  R p2_units_det 120 "MASTER_PORT=29612 $DET python3 -m benchmarks.vision_unit_probe > \$LOGS/vision_units_det.json" ) &
( R t1_optimizer_graph_det 150 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_optimizer_graph_det.json $PYT tests/gpu/test_optimizer_graph.py"
  R t2_vision_units 150 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_vision_units.json $PYT tests/gpu/test_vision_capture.py -k match_reference" ) &
wait
R b1_2b 240 "python3 -m benchmarks.bench --out \$LOGS/bench_2b --configs small-mbs1-seq2048 --variants ours,ours_optgraph --no-control --no-paired --measured-steps 10"
python3 - <<'PY'
import json, os
L = os.environ["LOGS"]
for f in ("vision_units.json", "vision_units_det.json"):
    try:
        d = json.load(open(os.path.join(L, f)))
    except Exception as e:
        print(f, "unreadable", e); continue
    for unit, r in d.items():
        for b in ("one_image_256", "three_images_512"):
            x = r.get(b) or {}
            moved = x.get("grads_moved") or {}
            print(f, unit, b, "loss_exact", x.get("loss_exact"), "moved", len(moved), sorted(moved.items(), key=lambda kv: -kv[1])[:4])
PY
table
