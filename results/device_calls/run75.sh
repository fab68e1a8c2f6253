#!/usr/bin/env bash
# Device call of run 75 (2026-12-03, session 6 of the day): #36's next lever, the packed ladders' parameter gradients
# summed into main_grad by one small graph per backward replay (bridge_cudagraph.capture.param_grads), proved and then
# measured, with the new CUDA-only profile's busy figure.
# In parallel, correctness only, under NVTE_ALLOW_NONDETERMINISTIC_ALGO=0: the packed suite's ladder, fewer-waits and
# tight cases (bit-exact against Bridge's unmodified model, summing on), the vision capture suite (thirty steps, copies
# in flight, LoRA), and the reference tests for fewer host waits, vision graphs and fused weight gradients.
# Then alone on the GPU: the useful-tokens benchmark on the 2B shape (sequence 4096, micro-batch 2, 2 micro-batches a
# step): eager_packed, ours_packed, ours_packed_autograd_grads (the lever off), the paired phase and the control.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run75.sh
set +e
export LOGS=/tmp/dl_run75
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1 NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
  R a_packed_det 220 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed_det.json $PYT tests/gpu/test_packed_language.py -k 'fewer_waits or tight or ladder_rungs'" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c2 NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
  R b_vision_det 220 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_vision_det.json $PYT tests/gpu/test_vision_capture.py" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c3 NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
  R c_reference_det 220 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_reference_det.json $PYT tests/gpu/test_bridge_reference.py -k 'fewer_host_waits or vision_graphs_match or fused_weight'" ) &
wait
export BRIDGE_CUDAGRAPH_CACHE=/tmp/c4
R d_ut_sums 330 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_sums --model small --seq 4096 --mbs 2 --num-mb 2 --steps 8 --warmup 3 --profile-steps 2 --variants eager_packed,ours_packed,ours_packed_autograd_grads"
grep -H " passed\| failed\| error" "$LOGS"/*.log | grep -v "PASSED\|FAILED" | cut -c1-200
grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/*.log | cut -c1-300 | head -20
grep -h "param_grads_summed\|summed_replays" "$LOGS"/gpu_*.json 2>/dev/null | sort | uniq -c | cut -c1-200 | head -8
grep -h "^| eager\|^| ours\|paired\|noise\|CUDA kernels only\|lever\|^- \*\*" "$LOGS/ut_sums/useful_tokens.md" 2>/dev/null | cut -c1-330 | head -30
table
