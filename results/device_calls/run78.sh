#!/usr/bin/env bash
# Device call of run 78 (2026-12-03, session 6 of the day), sized to the device time left: run 75's lever after its
# host changes moved into bridge_cudagraph/host/graph_grads.py (the same operations), two cases in parallel under
# NVTE_ALLOW_NONDETERMINISTIC_ALGO=0: the packed language ladder (rungs in any order, grown by a re-capture, every
# batch against Bridge's unmodified model) and the vision ladder's two copies in flight.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run78.sh
set +e
export LOGS=/tmp/dl_run78
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=5'
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1 NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
  R a_ladder_det 130 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed_det.json $PYT tests/gpu/test_packed_language.py -k ladder_rungs" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c2 NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
  R b_vision_copies_det 130 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_vision_det.json $PYT tests/gpu/test_vision_capture.py -k copies_in_flight" ) &
wait
grep -h "^FAILED\|^ERROR\|^E  \| passed\| failed" "$LOGS"/*.log | cut -c1-300 | head -12
table
