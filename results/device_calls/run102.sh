#!/usr/bin/env bash
# Run 102 (#47): the tiny MoE, Bridge's packed eager default against our packed graphs, the paired phase with 24
# pairs (run 94 had 8: an interval that is almost the range), alone on the card.
set +e
export LOGS=/tmp/dl_moe
source scripts/device_lib.sh
prologue
R a_ut_moe_tiny 330 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_moe_tiny --model tiny-moe --warmup 2 --steps 24 --profile-steps 0 --variants eager_packed,ours_packed --paired eager_packed,ours_packed"
sed -n '/^| variant/,/^$/p' "$LOGS/ut_moe_tiny/useful_tokens.md" | cut -c1-330 | head -8
grep -i "paired" "$LOGS/ut_moe_tiny/useful_tokens.md" | head -5 | cut -c1-400
table
