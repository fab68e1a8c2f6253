#!/usr/bin/env bash
# Device call of run 79 (2026-12-03, session 7 of the day): #36's next lever, the vision grid taken from the collate's
# host copy (bridge_cudagraph.vision.host_grids, host.forward.BoundGrids) instead of read back from the GPU, proved
# and then measured.
# In parallel, correctness only, under NVTE_ALLOW_NONDETERMINISTIC_ALGO=0: the packed suite's ladder, fewer-waits and
# tight cases (their batches now carry the collate's host grids) and the reference tests for fewer host waits and
# vision graphs (the new one: a replaying encoder reading the published host grid, bit for bit Bridge's model).
# Then alone on the GPU: the useful-tokens benchmark on the 2B shape (sequence 4096, micro-batch 2, 2 micro-batches a
# step): eager_packed, ours_packed, ours_packed_device_grid (the lever off), paired against each other, the control.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run79.sh
set +e
export LOGS=/tmp/dl_run79
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1 NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
  R a_packed_det 200 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed_det.json $PYT tests/gpu/test_packed_language.py -k 'fewer_waits or tight or ladder_rungs'" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c2 NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
  R b_reference_det 200 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_reference_det.json $PYT tests/gpu/test_bridge_reference.py -k 'fewer_host_waits or vision_graphs'" ) &
wait
export BRIDGE_CUDAGRAPH_CACHE=/tmp/c4
R c_ut_grid 345 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_grid --model small --seq 4096 --mbs 2 --num-mb 2 --steps 8 --warmup 3 --profile-steps 2 --variants eager_packed,ours_packed,ours_packed_device_grid --paired ours_packed_device_grid,ours_packed"
grep -H " passed\| failed\| error" "$LOGS"/*.log | grep -v "PASSED\|FAILED" | cut -c1-200
grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/*.log | cut -c1-300 | head -20
grep -h "host waits\|grid" "$LOGS"/gpu_reference_det.json 2>/dev/null | cut -c1-250 | head -6
grep -h "^| eager\|^| ours\|paired\|noise\|CUDA kernels only\|^- \*\*\|host waits on the GPU in one step" "$LOGS/ut_grid/useful_tokens.md" 2>/dev/null | cut -c1-330 | head -30
table
