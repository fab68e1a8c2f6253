#!/usr/bin/env bash
# Device call drafted 2026-12-04 for #46's one engine, not yet run (the session's device machine stopped answering).
# Padded rows of whole dense layers now replay on the ladder
# (capture/padded.py, through the decoder replay the packed graphs use); megatron-core's helper keeps parts of layers,
# MoE layers and virtual pipelines. Two lanes: (A) the language capture suite (padded ladder vs graphs-off model, bit
# for bit; DDP held back with its control), the plan's helpers, the capture-fault fallback and Bridge's loop; (B) under
# NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 the Bridge-reference suite and the packed ladder's capture/sum/tight cases.
#   cp results/device_calls/engine_draft.sh .snap/ (results/ stays home: the call's 64 MiB), then
#   bash .devwheels/install.sh >/dev/null 2>&1; bash .snap/engine_draft.sh
set +e
export LOGS=/tmp/dl_engine_draft
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
  R a_language 300 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_language.json $PYT tests/gpu/test_language_capture.py tests/gpu/test_plan_helpers.py tests/gpu/test_faults.py"
  R c_bridge_loop 300 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_loop.json $PYT tests/gpu/test_bridge_loop.py" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c2 NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
  R b_reference_det 220 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_reference_det.json $PYT tests/gpu/test_bridge_reference.py"
  R d_packed_det 250 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed_det.json $PYT tests/gpu/test_packed_language.py -k 'ladder_rungs or fewer_waits or tight'" ) &
wait
grep -H " passed\| failed\| error" "$LOGS"/*.log | grep -v "PASSED\|FAILED" | cut -c1-200
grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/*.log | cut -c1-300 | head -30
table
# Then, alone on the GPU (speed): the 2B benchmark with the padded ladder beside megatron-core's helper, every
# parameter's gradient against the floor, 17 steps:
#   python3 -m benchmarks.useful_tokens --out $LOGS/ut --model small --seq 4096 --mbs 2 --num-mb 2 --steps 17 \
#     --warmup 3 --profile-steps 2 --no-control --variants eager_packed,eager_padded,ours_padded,\
#     ours_padded_layer_graphs,ours_padded_megatron,eager_padded_repeat,ours_packed
