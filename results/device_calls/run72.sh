#!/usr/bin/env bash
# Device call of run 72 (2026-12-03, session 5 of the day), run 71 again after its fix (the step passes an all-ones
# attention mask, which run 71's FlatPackedRows declined: now checked on the host copy): #36's next lever, the step's packed rows handed to Bridge's
# Qwen3-VL forward flat (bridge_cudagraph.host.forward.FlatPackedRows), proved and then measured.
# In parallel, correctness only: the packed suite's fewer-waits and tight cases and the fewer-host-waits reference
# tests under NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 (bit-exact against Bridge's unmodified model; packed host waits
# counted against Bridge's), and the autograd-sites census of ours_packed with and without the lever.
# Then alone on the GPU: the useful-tokens benchmark on the 2B shape (sequence 4096, micro-batch 2, 2 micro-batches a
# step): eager_packed, ours_packed, ours_packed_bridge_packing (the lever off), the paired phase and the control.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run72.sh
set +e
export LOGS=/tmp/dl_run72
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1 NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
  R a_packed_det 200 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed_det.json $PYT tests/gpu/test_packed_language.py -k 'fewer_waits or tight'" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c2 NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
  R b_reference_det 200 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_reference_det.json $PYT tests/gpu/test_bridge_reference.py -k 'fewer_host_waits or merges_never_wait'" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c3
  R c_autograd_sites 180 "python3 -m benchmarks.autograd_sites --out \$LOGS/sites --model small --seq 4096 --mbs 2 --num-mb 2 --steps 1 --warmup 3 --profile-steps 0 --variants eager_packed,ours_packed_bridge_packing,ours_packed" ) &
wait
export BRIDGE_CUDAGRAPH_CACHE=/tmp/c4
R d_ut_flat 340 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_flat --model small --seq 4096 --mbs 2 --num-mb 2 --steps 8 --warmup 3 --profile-steps 2 --variants eager_packed,ours_packed,ours_packed_bridge_packing"
grep -H " passed\| failed\| error" "$LOGS"/*.log | grep -v "PASSED\|FAILED" | cut -c1-200
grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/*.log | cut -c1-300 | head -20
grep -h "host waits\|flat" "$LOGS"/gpu_*.json 2>/dev/null | cut -c1-300 | head -8
sed -n '/^ours_packed_bridge_packing: /,$p' "$LOGS/c_autograd_sites.log" | cut -c1-230 | head -50
grep -h "^| eager\|^| ours\|paired\|noise\|padding\|lever\|^- \*\*" "$LOGS/ut_flat/useful_tokens.md" 2>/dev/null | cut -c1-330 | head -30
table
