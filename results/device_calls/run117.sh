#!/usr/bin/env bash
# Run 117 (2026-12-06, one H100, 13:45-13:50 UTC, tree 43c005d): case H, the only call this session's device time
# allowed after twenty asks found no machine (thirteen starts failed, seven asks were turned away during a
# lockout); cut by its 230 s limit after three variants of each lane.
# Cases F and G (below) are the planned calls that found no machine.
# Session of 2026-12-06 (fifth), at the final code of #50's benchmark trim:
#   F  every one-GPU suite in eight lanes (as run 116), and two more lanes that run the tiny and the tiny MoE
#      benchmark under deterministic kernels with the benchmarks of c2c7ead (.snap/bench_head, before the trim) and
#      with the trimmed ones: the same JSON keys and the same non-timing numbers are the trim's proof on a GPU;
#   B  the 2B set without deterministic kernels at the final code, through the trimmed benchmark.
# Keep results/ out of the call (`git rm -r --cached -q results; echo /results/ >> .git/info/exclude`, undone with
# `git reset -q -- results` and that line removed; commit nothing in between), copy this file to .snap/next.sh, then
#   bash .devwheels/install.sh >/dev/null 2>&1; timeout 590 bash .snap/next.sh CASE   (files come back in $OUT/all.tgz)
set +e
export LOGS=/tmp/dl_next_$1
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
DET=NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
headline() {
    R "p_ut_2b_$1" 450 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_$1 --model small --seq 4096 --mbs 2 --num-mb 2 --steps 8 --warmup 3 --profile-steps 2 --variants eager_packed,ours_packed"
    grep -h "^| eager\|^| ours\|paired" "$LOGS/ut_$1/useful_tokens.md" 2>/dev/null | cut -c1-300 | head -8
}
bench_pair() {  # $1: head or new; the tiny and the tiny MoE benchmark, deterministic, all their variants
    local path=$PWD
    [ "$1" = head ] && path=$PWD/.snap/bench_head:$PWD
    R "u_tiny_$1" 240 "$DET PYTHONPATH=$path python3 -P -m benchmarks.useful_tokens --out \$LOGS/ut_tiny_$1 --model tiny --warmup 2 --steps 6 --profile-steps 1"
    R "u_moe_$1" 240 "$DET PYTHONPATH=$path python3 -P -m benchmarks.useful_tokens --out \$LOGS/ut_moe_$1 --model tiny-moe --warmup 2 --steps 6 --profile-steps 1"
}
suites() {
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
      R l1_bridge_loop 450 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_loop.json $PYT tests/gpu/test_bridge_loop.py -k 'not moe'"
      R l1_faults 100 "$PYT tests/gpu/test_faults.py" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c2
      R l2_bridge_loop_moe 400 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_loop_moe.json $PYT tests/gpu/test_bridge_loop.py -k 'moe and not padded_moe'"
      R l2_optimizer 150 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_optimizer.json $PYT tests/gpu/test_optimizer_host_step.py tests/gpu/test_optimizer_graph.py" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c3
      R l3_run_sh 150 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29641 bash scripts/run.sh"
      R l3_moe_packed_det 220 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_moe_packed_det.json $PYT tests/gpu/test_packed_moe.py"
      R l3_moe_packed 150 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_moe_packed.json $PYT tests/gpu/test_packed_moe.py" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c4
      R l4_language 250 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_language.json $PYT tests/gpu/test_language_capture.py tests/gpu/test_plan_helpers.py"
      R l4_vision 220 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_vision.json $PYT tests/gpu/test_vision_capture.py" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c5
      R l5_packed_det 300 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed_det.json $PYT tests/gpu/test_packed_language.py"
      R l5_reference_det 200 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_reference_det.json $PYT tests/gpu/test_bridge_reference.py" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c6 $DET
      R l6_train_photos_det 200 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29671 python3 -m bridge_cudagraph train recipes/tiny_qwen3_vl_photos.yaml train.train_iters=12"
      R l6_vision_padding_det 120 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_vision_padding_det.json $PYT tests/gpu/test_vision_padding.py"
      R l6_workspace_det 120 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_workspace_det.json $PYT tests/gpu/test_deterministic_workspace.py" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c7
      R l7_module_path 200 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29681 python3 -m benchmarks.module_path recipes/tiny_qwen3_vl_photos.yaml --out \$LOGS/module_path train.train_iters=6"
      python3 -m pip install -q --no-index --no-deps .snap/fla/*.whl > "$LOGS/fla_install.txt" 2>&1
      R l7_qwen35_det 240 "FLA_FLASH_QLA=0 $DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_qwen35_det.json $PYT tests/gpu/test_qwen35_vl_reference.py" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c8
      R l8_padded_moe_det 300 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_padded_moe_det.json $PYT tests/gpu/test_bridge_loop.py -k padded_moe" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c9; bench_pair head ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c10; bench_pair new ) &
    wait
    grep -H " passed\| failed\| error" "$LOGS"/l*.log | grep -v "PASSED\|FAILED" | cut -c1-200
    grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/l*.log | cut -c1-300 | head -30
    grep -h "capture failed\|eager fallbacks" "$LOGS/l6_train_photos_det.log" | cut -c1-250 | tail -4
    head -c 400 "$LOGS/module_path/module_path.json"
}
case "$1" in
H)  # the least: the dense tiny benchmark before and after the trim, side by side
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c9
      R u_tiny_head 170 "$DET PYTHONPATH=$PWD/.snap/bench_head:$PWD python3 -P -m benchmarks.useful_tokens --out \$LOGS/ut_tiny_head --model tiny --warmup 2 --steps 4 --profile-steps 1" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c10
      R u_tiny_new 170 "$DET PYTHONPATH=$PWD python3 -P -m benchmarks.useful_tokens --out \$LOGS/ut_tiny_new --model tiny --warmup 2 --steps 4 --profile-steps 1" ) &
    wait ;;
F) suites ;;
G)  # little device time left: the dense tiny benchmark before and after the trim, the module path, the photo recipe
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c9
      R u_tiny_head 200 "$DET PYTHONPATH=$PWD/.snap/bench_head:$PWD python3 -P -m benchmarks.useful_tokens --out \$LOGS/ut_tiny_head --model tiny --warmup 2 --steps 6 --profile-steps 1" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c10
      R u_tiny_new 200 "$DET PYTHONPATH=$PWD python3 -P -m benchmarks.useful_tokens --out \$LOGS/ut_tiny_new --model tiny --warmup 2 --steps 6 --profile-steps 1" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c7
      R l7_module_path 200 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29681 python3 -m benchmarks.module_path recipes/tiny_qwen3_vl_photos.yaml --out \$LOGS/module_path train.train_iters=6" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c6 $DET
      R l6_train_photos_det 200 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29671 python3 -m bridge_cudagraph train recipes/tiny_qwen3_vl_photos.yaml train.train_iters=12" ) &
    wait
    head -c 300 "$LOGS/module_path/module_path.json"; echo
    grep -h "capture failed\|eager fallbacks" "$LOGS/l6_train_photos_det.log" | cut -c1-250 | tail -3 ;;
B)
    export BRIDGE_CUDAGRAPH_CACHE=/tmp/c_2b
    R b_ut_2b 540 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_2b --model small --seq 4096 --mbs 2 --num-mb 2 --steps 6 --warmup 3 --profile-steps 0 --no-paired --variants eager_packed,eager_padded,ours_padded,ours_packed,eager_padded_repeat"
    sed -n '/^| variant/,/^$/p' "$LOGS/ut_2b/useful_tokens.md" | cut -c1-420 | head -12 ;;
P)
    export BRIDGE_CUDAGRAPH_CACHE=/tmp/c_2b
    headline "${2:-a}" ;;
W)
    R w_workspace_det 150 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_workspace_det.json $PYT tests/gpu/test_deterministic_workspace.py"
    python3 -c "import json; [print(r) for r in json.load(open('$LOGS/gpu_workspace_det.json'))['rows']]" 2>&1 | cut -c1-250 ;;
D)
    export BRIDGE_CUDAGRAPH_CACHE=/tmp/c_2b
    variants=eager_packed,eager_padded,ours_padded_language,ours_padded,eager_padded_repeat alloc=
    mbs=2
    if [ "$2" = h100 ]; then variants=eager_packed,eager_padded,ours_padded_language,eager_padded_repeat; alloc="NCCL_GRAPH_REGISTER=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"; fi
    if [ "$2" = h100all ]; then alloc="NCCL_GRAPH_REGISTER=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"; fi  # all five on 80 GB: does ours_padded fit unfragmented?
    seq=4096
    if [ "$2" = seq2048 ]; then seq=2048; variants=eager_packed,eager_padded,ours_padded_language,eager_padded_repeat; fi  # the 2B model at sequence 2048: half the activations
    R d_ut_2b_padded_det 540 "$alloc $DET python3 -m benchmarks.useful_tokens --out \$LOGS/ut_det --model small --seq $seq --mbs $mbs --num-mb 2 --steps 6 --warmup 3 --profile-steps 0 --no-paired --no-control --variants $variants"
    sed -n '/^| variant/,/^$/p' "$LOGS/ut_det/useful_tokens.md" | cut -c1-330
    grep -h "gradient\|grad norm\|floor" "$LOGS/ut_det/useful_tokens.md" | cut -c1-300 | head -20 ;;
esac
table
