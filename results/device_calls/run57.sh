#!/usr/bin/env bash
# Device call of run 57 (2026-12-02, session 17): the Bridge-reference suite under deterministic kernels after the
# host_positions_calls fix (each model counted once; the test now checks the aggregate against the model's counter).
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run57.sh
set +e
export LOGS=/tmp/dl_run57
source scripts/device_lib.sh
prologue
NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 R t1_reference 130 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_reference.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_bridge_reference.py"
grep -h " passed\| failed\| error" "$LOGS"/t*.log | grep -v "^PASSED\|^FAILED" | tail -3
grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/t*.log | cut -c1-300 | head -12
table
