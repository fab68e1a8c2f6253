#!/usr/bin/env bash
# Draft of the next session's device calls (not yet run). Runs 98-102 (2026-12-05, ninth session, one H100) passed
# every one-GPU suite and teardown at the product code of 03d73db, ran the first Qwen3.5-VL GPU test, measured the
# module path, the conversation recipe's data wait and the tiny MoE's paired phase. What is left, in the order that
# decides the most:
#   F  the final product code (4663e57 added FLA's Hopper refusal to check_stack): the Qwen3.5-VL test (its FLA
#      cases now check FLA raises as the probe says, then skip), the README's main job and the deterministic photo
#      train beside it (about 3 min)
#   C  #48's 2x target, decided: the conversation recipe with 4 workers, 100 iterations, three alternating repeats
#      (the 30-iteration runs of runs 99-100 gave 1.89-2.23x, median 1.96x)
#   P  #51: the 2B packed headline benchmark at the final commit, to be run in three calls (its between-call spread)
# Copy this and keep results/ out of the call (the staged stack and the tree are over the call's 64 MiB with it):
# `git rm -r --cached -q results; echo /results/ >> .git/info/exclude`, undone after the call with
# `git reset -q -- results` and that line removed. .snap/fla/ holds the FLA 0.5.2 wheels
# (`pip download --no-deps flash-linear-attention==0.5.2 fla-core==0.5.2`). Then
#   bash .devwheels/install.sh >/dev/null 2>&1; timeout 575 bash .snap/next_draft.sh F; cp -r /tmp/dl_next_F $OUT/
set +e
export LOGS=/tmp/dl_next_$1
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
DET=NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
case "$1" in
F)
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c7
      python3 -m pip install -q --no-index --no-deps .snap/fla/*.whl > "$LOGS/fla_install.txt" 2>&1
      python3 -c "import triton, torch; print('triton', triton.__version__, torch.cuda.get_device_capability())" >> "$LOGS/gpu.txt" 2>&1
      R f_qwen35_det 200 "FLA_FLASH_QLA=0 $DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_qwen35_det.json $PYT tests/gpu/test_qwen35_vl_reference.py" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c3
      R f_run_sh 150 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29641 bash scripts/run.sh" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c6 $DET
      R f_train_photos_det 200 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29671 python3 -m bridge_cudagraph train recipes/tiny_qwen3_vl_photos.yaml train.train_iters=12" ) &
    wait
    grep -h "PASSED\|SKIPPED\|FAILED\| passed\| failed" "$LOGS/f_qwen35_det.log" | cut -c1-250 ;;
C)
    export BRIDGE_CUDAGRAPH_CACHE=/tmp/c_conv
    R c_real_loop_w4x3 560 "python3 -m benchmarks.real_loop recipes/tiny_qwen3_vl_conversations.yaml --iters 100 --workers 4 --repeats 3 --out \$LOGS/real_loop_w4x3 --timeout 150 --port 29740"
    cat "$LOGS/real_loop_w4x3/real_loop.md" ;;
P)
    R p_ut_2b 560 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut --model small --variants eager_packed,ours_packed"
    sed -n '/^| variant/,/^$/p' "$LOGS/ut/useful_tokens.md" | cut -c1-330 ;;
esac
table
