#!/usr/bin/env bash
# Device call of run 69 (2026-12-03, session 4 of the day), cut to what the device time left holds (two earlier
# starts of a longer version got no machine): after the session's merges (the geometric vision ladder, the
# useful-tokens levers), two lanes sharing the GPU, neither a timing:
# (a) the plan-built helpers (the tiny recipe's derived ladders, now rungs 1.25x apart: bridge_cudagraph's own
#     helpers as `bridge-cudagraph train` makes them, faithful against Bridge's model);
# (b) benchmarks/autograd_sites.py on the 2B shape, its graph walk fixed, warmup 4 so that the fixed micro-batch
#     replays: which lines create the packed step's autograd nodes (IndexBackward0, AccumulateGrad, ...).
# The dense Bridge loop and the vision capture suite are left for a later call.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run69.sh
set +e
export LOGS=/tmp/dl_run69
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c2
  R a_plan_helpers 170 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_plan_helpers.json $PYT tests/gpu/test_plan_helpers.py" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c3
  R b_autograd_sites 170 "python3 -m benchmarks.autograd_sites --out \$LOGS/sites --model small --seq 4096 --mbs 2 --num-mb 2 --steps 1 --warmup 4 --profile-steps 0 --variants eager_packed,ours_packed" ) &
wait
grep -H " passed\| failed\| error" "$LOGS"/*.log | grep -v "PASSED\|FAILED" | cut -c1-200
grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/*.log | cut -c1-300 | head -20
sed -n '/^eager_packed: /,$p' "$LOGS/b_autograd_sites.log" | cut -c1-230 | head -90
table
