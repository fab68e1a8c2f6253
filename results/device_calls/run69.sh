#!/usr/bin/env bash
# Device call of run 69 (2026-12-03, session 4 of the day): #36, correctness first after the session's merges (the
# vision ladder's geometric rungs, the useful-tokens lever variants), and where the packed step's autograd nodes
# come from. Three lanes sharing the GPU (none of them a timing):
# (a) the dense Bridge loop (the packed photo job in Bridge's pretrain(), graphs on vs off within the eager floor;
#     the plan derives the vision ladder and tight packing; the recorder keeps tight replays);
# (b) the plan-built helpers (the tiny recipe's derived ladders, now rungs 1.25x apart); the vision capture suite
#     sets its budgets explicitly and is left for a later call (device time);
# (c) benchmarks/autograd_sites.py on the 2B shape, its graph walk fixed, warmup 4 so the fixed micro-batch replays.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run69.sh
set +e
export LOGS=/tmp/dl_run69
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
  R a_bridge_loop 290 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_loop.json $PYT tests/gpu/test_bridge_loop.py -k 'not moe'" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c2
  R d_plan_helpers 200 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_plan_helpers.json $PYT tests/gpu/test_plan_helpers.py" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c3
  R c_autograd_sites 200 "python3 -m benchmarks.autograd_sites --out \$LOGS/sites --model small --seq 4096 --mbs 2 --num-mb 2 --steps 1 --warmup 4 --profile-steps 0 --variants eager_packed,ours_packed" ) &
wait
grep -H " passed\| failed\| error" "$LOGS"/*.log | grep -v "PASSED\|FAILED" | cut -c1-200
grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/*.log | cut -c1-300 | head -20
sed -n '/^eager_packed: /,$p' "$LOGS/c_autograd_sites.log" | cut -c1-230 | head -90
table
