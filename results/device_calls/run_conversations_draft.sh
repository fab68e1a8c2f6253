#!/usr/bin/env bash
# Draft of a device call (not yet run; #48): the multi-image conversation recipe (recipes/tiny_qwen3_vl_conversations.yaml:
# 1-6 images a sample, text-only and multi-turn ones, Bridge's Qwen3-VL data path with its two DataLoader workers)
# through `bridge-cudagraph train`, 30 iterations, graphs on, then graphs off, then graphs on with 4 workers. One after
# the other, not side by side as run 86: the question is how long each step waits for its batch, and two runs would
# share the host's cores. Prints the data-wait line `train` reports and the cores this host gives the GPU.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash .snap/run_conversations_draft.sh
set +e
export LOGS=/tmp/dl_conversations
source scripts/device_lib.sh
prologue
{ echo "nproc $(nproc)"; echo "TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM-unset}"; } >> "$LOGS/gpu.txt"
export BRIDGE_CUDAGRAPH_CACHE=/tmp/c_conv
TRAIN="MASTER_ADDR=127.0.0.1 MASTER_PORT=29661 python3 -m bridge_cudagraph train recipes/tiny_qwen3_vl_conversations.yaml train.train_iters=30"
R a_conv_graphs 420 "$TRAIN"
R b_conv_eager 420 "$TRAIN model.cuda_graph.language.enabled=false model.cuda_graph.vision.enabled=false"
R c_conv_graphs_4w 420 "$TRAIN dataset.num_workers=4"
for f in a_conv_graphs b_conv_eager c_conv_graphs_4w; do
  echo "== $f"
  # The end-of-training lines (not every interval's), the last counters, Bridge's last iteration, any failure.
  grep -h "useful tokens\|data wait\|data is the limit\|iteration 30\]\|iteration       30\|DataLoader\|timed out\|Traceback\|finished in" \
    "$LOGS/$f.log" | grep -v "; iteration [0-9]*[;)]" | cut -c1-300 | tail -8
done
table
