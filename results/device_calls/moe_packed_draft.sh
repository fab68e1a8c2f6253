#!/usr/bin/env bash
# Device call drafted for the packed MoE graphs (branch moe-packed, capture/packed_moe.py): each MoE layer's attention
# graphed, its MLP half eager on the micro-batch's own tokens. This form has not run on a GPU (the form before it, with
# the router and dispatch preprocess in the graph, failed (A) on an H200: docs/design/moe-packed.md). Two lanes, then the 30B-A3B shape alone:
#  (A) under NVTE_ALLOW_NONDETERMINISTIC_ALGO=0: the packed MoE suite (tiny Qwen3-VL MoE on Bridge's packed step:
#      per-token loss exact against Bridge's unmodified MoE model, every gradient within the eager-vs-eager floor, the
#      router's aux and z losses exact, the dispatchers saw T rows only, graphs/replays/tail tokens counted), then the dense packed
#      suite's ladder cases (the replay hook must leave dense models as they were);
#  (B) the MoE recipe through Bridge's loop (recipes/tiny_qwen3_vl_moe_photos.yaml now packs: test_bridge_loop -k moe)
#      and the packed MoE suite without deterministic kernels (floors instead of bits).
# Then the 30B-A3B-shape benchmark under an 80 GiB cap: eager_packed against ours_packed (the packed MoE
# graphs) and ours_padded (expected to run out of memory there, as measured before).
#   cp results/device_calls/moe_packed_draft.sh .snap/ (results/ stays home: the call's 64 MiB), then
#   bash .devwheels/install.sh >/dev/null 2>&1; bash .snap/moe_packed_draft.sh
set +e
export LOGS=/tmp/dl_moe_packed_draft
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1 NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
  R a_moe_packed_det 300 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_moe_packed_det.json $PYT tests/gpu/test_packed_moe.py"
  R a_dense_packed_det 250 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed_det.json $PYT tests/gpu/test_packed_language.py -k 'ladder or tight'" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c2
  R b_moe_loop 300 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_moe_loop.json $PYT tests/gpu/test_bridge_loop.py -k moe"
  R b_moe_packed 240 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_moe_packed.json $PYT tests/gpu/test_packed_moe.py" ) &
wait
grep -H " passed\| failed\| error" "$LOGS"/*.log | grep -v "PASSED\|FAILED" | cut -c1-200
grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/*.log | cut -c1-300 | head -30
# Alone on the GPU (speed and memory): the command with ours_packed beside it, 80 GiB cap.
R c_30b_shape_80g 540 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_30b --model moe-30b-a3b-shape \
  --variants eager_packed,ours_packed,ours_padded --no-paired --no-control --steps 4 --profile-steps 0 --gpu-memory 80"
table
# If c_30b_shape_80g fits, the targets next (a call of its own): paired eager_packed / ours_packed on both MoE
# shapes, and 30 steps of the 30B-A3B shape under --gpu-memory 80 with graphs on:
#   python3 -m benchmarks.useful_tokens --out $LOGS/ut_moe --model tiny-moe --variants eager_packed,ours_packed \
#     --paired eager_packed,ours_packed --steps 8 --profile-steps 1
#   python3 -m benchmarks.useful_tokens --out $LOGS/ut_30b_30 --model moe-30b-a3b-shape \
#     --variants eager_packed,ours_packed --no-paired --no-control --steps 30 --profile-steps 0 --gpu-memory 80
#   (--variants must hold eager_packed, every packed variant's reference: the harness refuses ours_packed alone)
