#!/usr/bin/env bash
# Run 94 (2026-12-05, eighth session): case D of next_draft.sh as it stood at 132360c, run on an H100 (the H200 asked
# for first was not lent). #47: packed MoE graphs against Bridge's packed eager step, each benchmark alone: the tiny
# MoE with the paired phase, then the 30B-A3B layer shape under --gpu-memory 80 (an H100's size: the cap is torch's
# per-process fraction, so on an H100 it changes nothing and the card itself is the limit).
set +e
export LOGS=/tmp/dl_next_D
source scripts/device_lib.sh
prologue
# Kernel time from one profiled step each; the 30B-A3B shape with its control (eager_packed again, run last).
R d_ut_moe_tiny 200 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_moe_tiny --model tiny-moe --warmup 2 --steps 8 --profile-steps 1 --variants eager_packed,ours_packed --paired eager_packed,ours_packed"
R d_ut_moe_30b_80g 380 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_moe_30b --model moe-30b-a3b-shape --microbatches 4 --warmup 2 --steps 6 --profile-steps 1 --variants eager_packed,ours_packed --no-paired --gpu-memory 80"
for m in ut_moe_tiny ut_moe_30b; do sed -n '/^| variant/,/^$/p' "$LOGS/$m/useful_tokens.md" 2>/dev/null | cut -c1-330 | head -8; done
table
