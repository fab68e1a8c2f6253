#!/usr/bin/env bash
# Run 95 (2026-12-05, eighth session, H100, tree 5928a13 + the unbound test world): case C of next_draft.sh.
# On an 80 GB H100: where the ~14.6 GiB outside PyTorch's allocator of runs 92 and 94 comes from, stage by stage,
# with the default group bound to the device (as the test world was), unbound (as Bridge's initialize, and the
# test world now), or bound with shared NCCL split resources; unbound, through a tiny-MoE run with packed graphs
# (communicators created lazily, none inside a capture). Then #47's 30B-A3B shape on the real 80 GB card,
# eager_packed and ours_packed in one process, 30 measured steps (MoE models no longer outlive their variant).
set +e
export LOGS=/tmp/dl_next_C
source scripts/device_lib.sh
prologue
for mode in bound shared unbound; do
  R "c_outside_$mode" 150 "python3 .snap/outside_memory_draft.py $mode \$LOGS/outside_$mode"
done
R c_ut_moe_30b 330 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_moe_30b --model moe-30b-a3b-shape --microbatches 4 --warmup 2 --steps 30 --profile-steps 1 --variants eager_packed,ours_packed --no-paired --no-control"
grep -h "^\[outside\]" "$LOGS"/c_outside_*.log
sed -n '/^| variant/,/^$/p' "$LOGS/ut_moe_30b/useful_tokens.md" | cut -c1-330 | head -8
sed -n '/^## Memory/,/^- \*\*language ladder/p' "$LOGS/ut_moe_30b/useful_tokens.md" | head -14
table
