#!/usr/bin/env bash
# Device call of run 77 (2026-12-03, session 6 of the day): run 75's lever measured side by side. Alone on the GPU:
# the useful-tokens benchmark on the 2B shape (sequence 4096, micro-batch 2, 2 micro-batches a step): eager_packed,
# ours_packed, ours_packed_autograd_grads (the lever off), the paired phase on the lever's pair (both graphed models
# alive, steps interleaved) and the control; with run 76's fix (the tight replay norms the full rows).
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run77.sh
set +e
export LOGS=/tmp/dl_run77
source scripts/device_lib.sh
prologue
export BRIDGE_CUDAGRAPH_CACHE=/tmp/c4
R a_ut_lever_paired 360 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_lever --model small --seq 4096 --mbs 2 --num-mb 2 --steps 8 --warmup 3 --profile-steps 2 --variants eager_packed,ours_packed,ours_packed_autograd_grads --paired ours_packed_autograd_grads,ours_packed"
grep -h "^| eager\|^| ours\|paired\|noise\|CUDA kernels only\|^- \*\*" "$LOGS/ut_lever/useful_tokens.md" 2>/dev/null | cut -c1-330 | head -24
table
