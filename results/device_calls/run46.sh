#!/usr/bin/env bash
# Device call of run 46 (2026-12-02, session 14, issue #18): after the review of the change, the forward lever's
# Bridge-reference tests again, deterministic kernels: forward_host now asks Bridge's own _is_mrope_position_ids,
# and the tests count waits with the benchmark's census (benchmarks/host_syncs.py) instead of a copy of it.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run46.sh
set +e
export LOGS=/tmp/dl_run46
source scripts/device_lib.sh
prologue
NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 R t1_reference_waits 110 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_reference_waits.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_bridge_reference.py -k 'host_waits or wait_at_most'"
grep -h "wait" "$LOGS"/gpu_reference_waits.json | head -c 1500; echo
table
