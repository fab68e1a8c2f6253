#!/usr/bin/env bash
# Run 99 (#48): the multi-image conversation recipe through the product's real loop (benchmarks/real_loop.py:
# `bridge-cudagraph train`, Bridge's data loader and its workers), graphs on then off, 30 iterations, two workers
# (Bridge's recipes' count), then six; one run at a time so the data wait is not shared with another run's workers.
set +e
export LOGS=/tmp/dl_conv
source scripts/device_lib.sh
prologue
{ echo "nproc $(nproc)"; echo "TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM-unset}"; } >> "$LOGS/gpu.txt"
export BRIDGE_CUDAGRAPH_CACHE=/tmp/c_conv
R a_real_loop_w2 300 "python3 -m benchmarks.real_loop recipes/tiny_qwen3_vl_conversations.yaml --iters 30 --workers 2 --out \$LOGS/real_loop_w2 --timeout 145 --port 29700"
R b_real_loop_w6 250 "python3 -m benchmarks.real_loop recipes/tiny_qwen3_vl_conversations.yaml --iters 30 --workers 6 --out \$LOGS/real_loop_w6 --timeout 120 --port 29710"
cat "$LOGS"/real_loop_w*/real_loop.md
table
