#!/usr/bin/env bash
# Device call of run 73 (2026-12-03, session 5 of the day): correctness only, three lanes in parallel.
# a: the packed suite's fewer-waits and tight cases under NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 (run 72's two failures
#    were the test's own wait bound, now the lever against the same model with Bridge's packing);
# b: the dense Bridge loop test (tests/gpu/test_bridge_loop.py -k 'not moe') on the tiny photo recipe, now with its
#    vision ladder derived (rungs <= 1.25x apart) and the step's rows handed flat (FlatPackedRows counted);
# c: the vision capture suite, not run since the geometric vision ladder.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run73.sh
set +e
export LOGS=/tmp/dl_run73
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1 NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
  R a_packed_det 200 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed_det.json $PYT tests/gpu/test_packed_language.py -k 'fewer_waits or tight'" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c2
  R b_bridge_loop 330 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_loop.json $PYT tests/gpu/test_bridge_loop.py -k 'not moe'" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c3
  R c_vision 240 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_vision.json $PYT tests/gpu/test_vision_capture.py" ) &
wait
grep -H " passed\| failed\| error" "$LOGS"/*.log | grep -v "PASSED\|FAILED" | cut -c1-200
grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/*.log | cut -c1-300 | head -30
grep -h -A4 "host waits per packed\|flat_batches_on" "$LOGS"/gpu_*.json 2>/dev/null | cut -c1-200 | head -20
table
