#!/usr/bin/env bash
# Run 96 (2026-12-05, eighth session, H100, same tree as run 95, warm machine): case P of next_draft.sh.
# #46's 2B padded set on an 80 GB H100 once the test world no longer holds ~14.6 GiB of NCCL communicators: the
# step-loss floor (eager_padded_repeat) and the padded ladder beside megatron-core's helper, 12 steps.
set +e
export LOGS=/tmp/dl_next_P
source scripts/device_lib.sh
prologue
R p_ut_2b_padded 540 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut --model small --seq 4096 --mbs 2 --num-mb 2 --steps 12 --warmup 3 --profile-steps 0 --no-paired --no-control --variants eager_packed,eager_padded,ours_padded,ours_padded_megatron,eager_padded_repeat"
sed -n '/^| variant/,/^$/p' "$LOGS/ut/useful_tokens.md" | cut -c1-330
sed -n '/^## Memory/,/^$/p' "$LOGS/ut/useful_tokens.md" | head -10
table
