#!/usr/bin/env bash
# Draft of the next session's device calls (not yet run). Runs 105-109 (2026-12-06, one H100) ran every one-GPU suite
# and the 2B headline in three calls at the final code of that day (8e51b55, one language engine); what needs more
# than an 80 GB card is left, in the order that decides the most:
#   P  #51: the 2B packed headline with its paired phase (89 GiB for both models): needs an H200 (needs_h200).
#      One process per call, about 190 s; three calls at one commit.
#   D  #46: the 2B padded set under deterministic kernels (eager_packed is required by the benchmark as the packed
#      reference): on an 80 GB H100 ours_padded ran out of memory (run 106, a 32 GiB request); on an H200 run 85
#      (older code) ran out in its vision graphs. Needs the H200 and, if it still does not fit, a lower vision top rung
#      under deterministic kernels in plan/determinism.py.
#   T  teardown at the final code (passed alone at 03d73db, run 101).
# Keep results/ out of the call (the staged stack and the tree are over the call's 64 MiB with it):
# `git rm -r --cached -q results; echo /results/ >> .git/info/exclude`, undone after the call with
# `git reset -q -- results` and that line removed. Then
#   bash .devwheels/install.sh >/dev/null 2>&1; timeout 575 bash .snap/next_draft.sh P; cp -r /tmp/dl_next_P $OUT/
set +e
export LOGS=/tmp/dl_next_$1
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
DET=NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
case "$1" in
P)
    export BRIDGE_CUDAGRAPH_CACHE=/tmp/c_2b
    R p_ut_2b 300 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut --model small --seq 4096 --mbs 2 --num-mb 2 --steps 8 --warmup 3 --profile-steps 2 --variants eager_packed,ours_packed"
    grep -h "^| eager\|^| ours\|paired" "$LOGS/ut/useful_tokens.md" | cut -c1-300 ;;
D)
    export BRIDGE_CUDAGRAPH_CACHE=/tmp/c_2b
    R d_ut_2b_padded_det 450 "$DET python3 -m benchmarks.useful_tokens --out \$LOGS/ut_det --model small --seq 4096 --mbs 2 --num-mb 2 --steps 6 --warmup 3 --profile-steps 0 --no-paired --no-control --variants eager_packed,eager_padded,ours_padded_language,ours_padded,eager_padded_repeat"
    sed -n '/^| variant/,/^$/p' "$LOGS/ut_det/useful_tokens.md" | cut -c1-330 ;;
T)
    export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
    R t_teardown 480 "BRIDGE_CUDAGRAPH_LOGS=\$LOGS/teardown BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_teardown.json $PYT tests/gpu/test_teardown.py" ;;
esac
table
