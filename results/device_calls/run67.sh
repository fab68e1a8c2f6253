#!/usr/bin/env bash
# Device call of run 67 (2026-12-03): #36's first levers, correctness first.
# (1) tests, two lanes: the packed language suite under NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 (its existing exactness
#     tests now run with tight packing where the plan derives it, and the new tight-packing test), and the dense
#     Bridge loop (the packed photo job in Bridge's pretrain(), graphs on vs off within the eager floor);
# (2) alone on the GPU: the useful-tokens benchmark on the 2B shape, Bridge's packed eager step against our packed
#     graphs with tight packing, the paired phase (both alive, steps interleaved) and the control;
# (3) alone on the GPU: GPT offline-packed SFT at Qwen3-8B's layer shape (4 layers): eager, our packed graphs, the
#     control, then megatron-core's full-iteration graph (benchmarks/gpt_full_iteration.py).
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run67.sh
set +e
export LOGS=/tmp/dl_run67
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1 NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
  R a_packed_det 225 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed_det.json $PYT tests/gpu/test_packed_language.py" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c2
  R b_bridge_loop 225 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_loop.json $PYT tests/gpu/test_bridge_loop.py -k 'not moe'" ) &
wait
export BRIDGE_CUDAGRAPH_CACHE=/tmp/c3
R c_ut_small 200 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_small --model small --seq 4096 --mbs 2 --num-mb 2 --steps 8 --warmup 3 --profile-steps 1 --variants eager_packed,ours_packed"
R d_gpt_full_iteration 130 "python3 -m benchmarks.gpt_full_iteration --out \$LOGS/gpt_fi --configs qwen3_8b_4l --steps 8 --warmup 3 --profile-steps 1"
grep -H " passed\| failed\| error" "$LOGS"/*.log | grep -v "PASSED\|FAILED" | cut -c1-200
grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/*.log | cut -c1-300 | head -20
grep -h "^| eager\|^| ours\|paired\|noise\|padding\|kernel" "$LOGS/ut_small/useful_tokens.md" 2>/dev/null | cut -c1-330 | head -16
grep -h "^|" "$LOGS/gpt_fi/gpt_full_iteration.md" 2>/dev/null | cut -c1-330 | head -12
table
