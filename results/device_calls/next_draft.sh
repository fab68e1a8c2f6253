#!/usr/bin/env bash
# Draft of the next session's device calls (not yet run). Runs 103-104 (2026-12-06, one H100) ran every one-GPU suite
# at the final code of that day (e99042b, padded MoE on the ladder), #48's 2x (met) and the 2B headline in two calls
# (3.58x, 3.28x separately; the paired phase needs 89 GiB, over an 80 GB card). What is left, in the order that
# decides the most:
#   P  #51: the 2B packed headline, paired, in three calls at one commit: needs an H200 (nvidia-h200; on an H100 the
#      paired phase is skipped for memory). One process per call, about 190 s.
#   D  #46: the 2B padded set under deterministic kernels (eager_padded, ours_padded_language, ours_padded,
#      eager_padded_repeat): the fixed-batch gradient norm against the 1e-4 target where eager equals itself. Run 85
#      (H200, older code) ran out of memory in ours_padded's vision graphs; the plan now lowers the deterministic
#      vision shapes (plan/determinism.py), untested at this shape.
#   T  teardown at the final code (passed alone at 03d73db, run 101).
# Not drafted: padded MoE speed on the ladder against the router scope on megatron-core's helper. The benchmark's
# ours_padded gives an MoE model the router scope (useful_tokens.MOE_SCOPE); a variant with modules null comes first.
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
    R d_ut_2b_padded_det 450 "$DET python3 -m benchmarks.useful_tokens --out \$LOGS/ut_det --model small --seq 4096 --mbs 2 --num-mb 2 --steps 6 --warmup 3 --profile-steps 0 --no-paired --no-control --variants eager_padded,ours_padded_language,ours_padded,eager_padded_repeat"
    sed -n '/^| variant/,/^$/p' "$LOGS/ut_det/useful_tokens.md" | cut -c1-330 ;;
T)
    export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
    R t_teardown 480 "BRIDGE_CUDAGRAPH_LOGS=\$LOGS/teardown BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_teardown.json $PYT tests/gpu/test_teardown.py" ;;
esac
table
