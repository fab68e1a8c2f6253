#!/usr/bin/env bash
# Draft of the next session's device calls (not yet run). Runs 90-93 (2026-12-05, seventh session) ran every one-GPU
# suite but teardown at the packed-MoE branch, which main then fast-forwarded to (results/gpu-suites/run90,
# results/moe/run91-93). What is left, one call each, in the order that decides the most:
#   A  (H200 only: pass needs_h200; the 2B padded set runs out of memory on an 80 GB H100 even alone, run 92) #46's 2B
#      benchmark alone: padded and packed gradients and floors, the step-loss floor, the padded ladder beside
#      megatron-core's helper (about 9 min)
#   D  #47: packed MoE graphs against Bridge's packed step: the tiny MoE paired, then the 30B-A3B layer shape under an
#      80 GiB cap (about 7 min; an H100 is the card the cap stands for)
#   E  the eager-shape question of runs 91-93 (eager_shapes_draft.py in three fresh processes, about 3 min) beside
#      teardown and #50's module path (B's lanes)
# Copy this and eager_shapes_draft.py to .snap/ and keep results/ out of the call (the staged stack and the tree are
# over the call's 64 MiB with it): `git rm -r --cached -q results; echo /results/ >> .git/info/exclude`, undone after
# the call with `git reset -q -- results` and that line removed. Then
#   bash .devwheels/install.sh >/dev/null 2>&1; bash .snap/next_draft.sh A
set +e
export LOGS=/tmp/dl_next_$1
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
case "$1" in
A)  # #46 to its end: the padded ladder beside megatron-core's helper (the measured reason for one engine or two), the
    # step-loss floor (eager_padded_repeat, which run 89 did not reach), ours_packed's gradients, 17 steps, alone (runs
    # 90-92 lost every padded variant to memory: shared lanes, then an 80 GB card).
    R a_ut_2b 560 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut --model small --seq 4096 --mbs 2 --num-mb 2 --steps 17 --warmup 3 --profile-steps 0 --no-paired --no-control --variants eager_packed,eager_padded,ours_padded,ours_padded_megatron,eager_padded_repeat,ours_packed"
    sed -n '/^| variant/,/^$/p' "$LOGS/ut/useful_tokens.md" | cut -c1-330 ;;
B|E)  # Teardown with fewer lanes beside it (it timed out at 400 s under six in run 87; not run since), #50's module
    # path (now through sys.monitoring), and (E) the eager-shape question: the graphs-off MoE model's loss of the
    # first token count, as is, with static shapes only, and without the compiled cross entropy.
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c4
      for mode in as_is static_shapes no_ce_fusion; do
        R "e_shapes_$mode" 120 "python3 .snap/eager_shapes_draft.py $mode"
      done ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
      R b_teardown 480 "BRIDGE_CUDAGRAPH_LOGS=\$LOGS/teardown BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_teardown.json $PYT tests/gpu/test_teardown.py" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c3
      R m_module_path 240 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29681 python3 -m benchmarks.module_path recipes/tiny_qwen3_vl_photos.yaml --out \$LOGS/module_path train.train_iters=6" ) &
    wait
    grep -H " passed\| failed\| error" "$LOGS"/*.log | grep -v "PASSED\|FAILED" | cut -c1-200
    tail -n 1 "$LOGS"/e_shapes_*.log
    cat "$LOGS/module_path/module_path.json" | head -12 ;;
D)  # #47: packed MoE graphs against Bridge's packed eager step, each benchmark alone: the tiny MoE with the paired
    # phase (#47 asks for paired ratios), then the issue's 30B-A3B layer shape under an 80 GiB cap, separately with its
    # control (two of its models side by side do not fit 80 GiB: eager alone peaks at 66.7 / 69.1, run 66); kernel
    # time from one profiled step each. Run 66's commands, sizes and times (170 s and 360 s) kept.
    R d_ut_moe_tiny 200 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_moe_tiny --model tiny-moe --warmup 2 --steps 8 --profile-steps 1 --variants eager_packed,ours_packed --paired eager_packed,ours_packed"
    R d_ut_moe_30b_80g 380 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_moe_30b --model moe-30b-a3b-shape --microbatches 4 --warmup 2 --steps 6 --profile-steps 1 --variants eager_packed,ours_packed --no-paired --gpu-memory 80"
    for m in ut_moe_tiny ut_moe_30b; do sed -n '/^| variant/,/^$/p' "$LOGS/$m/useful_tokens.md" 2>/dev/null | cut -c1-330 | head -8; done ;;
C)  # After A on the same H200: where the ~14.6 GiB outside PyTorch's allocator of runs 92 and 94 comes from (stage by
    # stage, alone on the card), then #47's 30B-A3B shape, eager_packed and ours_packed in one process, 30 measured
    # steps, uncapped: --gpu-memory caps only the allocator and the first variant's leftovers count in the second's
    # peak, so the report's own peaks and the memory outside the allocator decide whether it fits 80 GB.
    R c_outside 150 "python3 .snap/outside_memory_draft.py \$LOGS/outside"
    R c_ut_moe_30b 420 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_moe_30b --model moe-30b-a3b-shape --microbatches 4 --warmup 2 --steps 30 --profile-steps 1 --variants eager_packed,ours_packed --no-paired --no-control"
    grep -h "^\[outside\]" "$LOGS/c_outside.log"
    sed -n '/^| variant/,/^$/p' "$LOGS/ut_moe_30b/useful_tokens.md" | cut -c1-330 | head -8
    sed -n '/^## Memory/,/^## [A-LN-Z]/p' "$LOGS/ut_moe_30b/useful_tokens.md" | head -20 ;;
esac
table
