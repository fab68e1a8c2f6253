#!/usr/bin/env bash
# Device call of run 74 (2026-12-03, session 5 of the day), sized to the 253 s of device time left after a start that
# got no machine: the one packed-suite case that covers FlatPackedRows end to end under
# NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 (runs of layers, fused, fewer waits): bit-exact against Bridge's unmodified
# model, the wait bound against the same model with Bridge's packing, and the dropped-token raise, which run 73's
# test bug kept from running.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run74.sh
set +e
export LOGS=/tmp/dl_run74
source scripts/device_lib.sh
prologue
export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1 NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
R a_packed_det 120 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed_det.json $PYT tests/gpu/test_packed_language.py -k fewer_waits_runs"
grep -h "^FAILED\|^ERROR\|^E  \| passed\| failed" "$LOGS"/*.log | cut -c1-300 | head -12
grep -h -A5 "host waits per packed" "$LOGS"/gpu_*.json 2>/dev/null | cut -c1-200 | head -8
table
