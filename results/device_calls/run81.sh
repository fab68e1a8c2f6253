#!/usr/bin/env bash
# Device call of run 81 (2026-12-03, session 7 of the day): #36's headline in one call with every lever on (the collate's
# host grid included), alone on the GPU: the useful-tokens benchmark on the 2B shape (sequence 4096, micro-batch 2, 2
# micro-batches a step), eager_packed and ours_packed, paired against each other (the default pair), the control last.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run81.sh
set +e
export LOGS=/tmp/dl_run81
source scripts/device_lib.sh
prologue
export BRIDGE_CUDAGRAPH_CACHE=/tmp/c4
R a_ut_headline 345 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_headline --model small --seq 4096 --mbs 2 --num-mb 2 --steps 8 --warmup 3 --profile-steps 2 --variants eager_packed,ours_packed"
grep -h "^| eager\|^| ours\|paired\|noise\|CUDA kernels only\|^- \*\*\|host waits on the GPU in one step\|^Per step" "$LOGS/ut_headline/useful_tokens.md" 2>/dev/null | cut -c1-330 | head -30
table
