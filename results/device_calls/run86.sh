#!/usr/bin/env bash
# Device call of run 86 (2026-12-04): #48's workers in Bridge's loop. The README's main job (scripts/run.sh, the tiny
# photo recipe: Bridge's Qwen3-VL data path, now with Bridge's two DataLoader workers) 30 iterations, graphs on and
# graphs off, side by side on the one GPU (their speeds are not compared here: the question is whether batches come).
#   bash .devwheels/install.sh >/dev/null 2>&1; bash .snap/run86.sh
set +e
export LOGS=/tmp/dl_run86
source scripts/device_lib.sh
prologue
echo "TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM-unset}" >> "$LOGS/gpu.txt"
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
  R a_main_graphs 330 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29641 bash scripts/run.sh train.train_iters=30" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c2
  R b_main_eager 330 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29651 bash scripts/run.sh train.train_iters=30 model.cuda_graph.language.enabled=false model.cuda_graph.vision.enabled=false" ) &
wait
for f in a_main_graphs b_main_eager; do echo "== $f"; grep -h "num_workers\|useful tokens\|tok/s\|iteration       30\|DataLoader\|timed out\|Traceback\|finished in" "$LOGS/$f.log" | cut -c1-260 | tail -6; done
table
