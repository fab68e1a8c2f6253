#!/usr/bin/env bash
# Device call of run 70 (2026-12-03, session 4 of the day): #36's levers side by side, alone on the GPU. The
# useful-tokens benchmark on the 2B shape (sequence 4096, micro-batch 2, 2 micro-batches a step, photos through
# Bridge's data path): Bridge's packed eager step, our packed graphs as the product now derives them (tight packing,
# vision rungs 1.25x apart), and one variant per lever with that lever off or on (tight packing off; the former
# vision halvings; gradient-accumulation fusion, eager and graphed); the paired phase (eager_packed vs ours_packed,
# both alive, steps interleaved), a host-sync census step per packed variant, and the control last.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run70.sh
set +e
export LOGS=/tmp/dl_run70
source scripts/device_lib.sh
prologue
export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
R a_ut_levers 570 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_levers --model small --seq 4096 --mbs 2 --num-mb 2 --steps 8 --warmup 3 --profile-steps 2 --variants eager_packed,eager_packed_fused,ours_packed,ours_packed_rows,ours_packed_halvings,ours_packed_fused"
grep -h "^| eager\|^| ours\|paired\|noise\|padding\|kernel\|lever\|pays\|^- \*\*" "$LOGS/ut_levers/useful_tokens.md" 2>/dev/null | cut -c1-330 | head -40
table
