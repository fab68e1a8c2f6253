#!/usr/bin/env bash
# Device call of run 34 (2026-12-01, session 10, last 128 s of device time): the deterministic vision checks that
# the deepstack default touches and run 32 did not run: padded eager vs graphs (test_vision_padding, which swaps
# per-layer eager callables into a graph set) and the vision graphs against Bridge's unmodified provider.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run34.sh
set +e
export LOGS=/tmp/dl_run34
source scripts/device_lib.sh
prologue
DET=NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
PYT='python3 -m pytest -q -rA -p no:cacheprovider'
R v1_padding_det 60 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_vision_padding_det.json $PYT tests/gpu/test_vision_padding.py"
R v2_bridge_reference_vision_det 60 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_reference_vision_det.json $PYT tests/gpu/test_bridge_reference.py -k vision"
table
