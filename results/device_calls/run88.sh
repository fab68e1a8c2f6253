#!/usr/bin/env bash
# Device call of run 88 (2026-12-05): #46's 2B proof alone on the GPU at main's HEAD: the useful-tokens benchmark at
# the 2B shape (sequence 4096, micro-batch 2, 2 micro-batches, 17 steps), the padded ladder (ours_padded) beside
# megatron-core's helper (ours_padded_megatron) and whole-layer graphs, every parameter's gradient against the
# eager-vs-eager floor (eager_padded_repeat), the packed forms beside; then #50's module path of a train call.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash .snap/run88.sh
set +e
export LOGS=/tmp/dl_run88
source scripts/device_lib.sh
prologue
export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
R a_ut_2b 450 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut --model small --seq 4096 --mbs 2 --num-mb 2 --steps 17 --warmup 3 --profile-steps 2 --no-control --variants eager_packed,eager_padded,ours_padded,ours_padded_layer_graphs,ours_padded_megatron,eager_padded_repeat,ours_packed"
R b_module_path 120 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29661 python3 -m benchmarks.module_path recipes/tiny_qwen3_vl_photos.yaml --out \$LOGS/module_path"
tail -n 40 "$LOGS/ut/useful_tokens.md" 2>/dev/null | cut -c1-400
tail -n 30 "$LOGS/b_module_path.log" | cut -c1-250
table
