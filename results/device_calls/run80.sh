#!/usr/bin/env bash
# Device call of run 80 (2026-12-03, session 7 of the day): the collate's host grid (bridge_cudagraph.vision.host_grids)
# where Bridge's loop publishes it: the dense Bridge-loop suite (graphs on, off and fused, through
# bridge_cudagraph.bridge.train.run, whose forward step now publishes each drawn batch's grids), the README's main job
# (scripts/run.sh), and, under NVTE_ALLOW_NONDETERMINISTIC_ALGO=0, run 79's failed reference test with its wait count
# now taken by site.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run80.sh
set +e
export LOGS=/tmp/dl_run80
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1 NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
  R a_reference_det 200 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_reference_det.json $PYT tests/gpu/test_bridge_reference.py -k 'host_grid or fewer_host_waits'" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c2
  R b_bridge_loop 330 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_loop.json $PYT tests/gpu/test_bridge_loop.py -k 'not moe'" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c3
  R c_run_sh 240 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29641 bash scripts/run.sh" ) &
wait
grep -H " passed\| failed\| error" "$LOGS"/*.log | grep -v "PASSED\|FAILED" | cut -c1-200
grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/*.log | cut -c1-300 | head -30
grep -h "grid_binds\|grids_read_back\|in the encoder" "$LOGS"/gpu_*.json 2>/dev/null | sort | uniq -c | cut -c1-200 | head -8
grep -h "useful tokens\|tok/s\|replays" "$LOGS"/c_run_sh.log | cut -c1-250 | tail -8
table
