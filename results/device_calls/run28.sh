#!/usr/bin/env bash
# Device call of run 28 (2026-12-01, session 9): run 26's call again (4 measured steps), after run 27 measured every
# variant and then failed each one's closing parity check on a buffer the model makes at its first forward; then the
# new LoRA test of the vision suite (Bridge's LoRA in both submodules' graphs under pure M4 groups).
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run28.sh
STEPS=4 LOGS=/tmp/dl_run28 BENCH_LIMIT=420 bash results/device_calls/run26.sh
export LOGS=/tmp/dl_run28
source scripts/device_lib.sh
R s2_vision_lora 150 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_vision_lora.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_vision_capture.py -k lora"
table
