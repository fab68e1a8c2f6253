#!/usr/bin/env bash
# Draft of a device call (not yet run; #48): the multi-image conversation recipe (recipes/tiny_qwen3_vl_conversations.yaml:
# 1-6 images a sample, text-only and multi-turn ones, Bridge's Qwen3-VL data path with its two DataLoader workers)
# through `bridge-cudagraph train`, 30 iterations, graphs on, then graphs off. One after
# the other, not side by side as run 86: the question is how long each step waits for its batch, and two runs would
# share the host's cores. Prints the data-wait line `train` reports and the cores this host gives the GPU.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash .snap/run_conversations_draft.sh
set +e
export LOGS=/tmp/dl_conversations
source scripts/device_lib.sh
prologue
{ echo "nproc $(nproc)"; echo "TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM-unset}"; } >> "$LOGS/gpu.txt"
export BRIDGE_CUDAGRAPH_CACHE=/tmp/c_conv
# The product's loop, graphs on then off, through benchmarks/real_loop.py (end-of-training useful tokens/s, data wait,
# peak memory, loss against eager, graphs and replays checked); 4 workers in a second call if 2 leave the step
# data-bound (each train run takes 2-3 minutes here, and one call has 10).
R a_real_loop_w2 560 "python3 -m benchmarks.real_loop recipes/tiny_qwen3_vl_conversations.yaml --iters 30 --workers 2 --out \$LOGS/real_loop_w2 --timeout 270"
cat "$LOGS/real_loop_w2/real_loop.md"
table
