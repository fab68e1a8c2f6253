#!/usr/bin/env bash
# Runs 98 (case S) and 101 (case T: run101.sh), ninth session of 2026-12-05, H100. S: every one-GPU suite at the product code
# of 03d73db (run 90's case S without its 2B benchmark lane, which starved the others), beside the first
# Qwen3.5-VL GPU test (FLA 0.5.2 from .snap/fla) and #50's module path. T: teardown alone.
set +e
export LOGS=/tmp/dl_next_$1
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
DET=NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
case "$1" in
S)
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
      R l1_bridge_loop 450 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_loop.json $PYT tests/gpu/test_bridge_loop.py -k 'not moe'"
      R l1_faults 100 "$PYT tests/gpu/test_faults.py" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c2
      R l2_bridge_loop_moe 400 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_loop_moe.json $PYT tests/gpu/test_bridge_loop.py -k moe"
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
      R l6_vision_padding_det 120 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_vision_padding_det.json $PYT tests/gpu/test_vision_padding.py" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c7
      R l7_module_path 200 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29681 python3 -m benchmarks.module_path recipes/tiny_qwen3_vl_photos.yaml --out \$LOGS/module_path train.train_iters=6"
      python3 -m pip install -q --no-index --no-deps .snap/fla/*.whl > "$LOGS/fla_install.txt" 2>&1
      R l7_qwen35_det 240 "FLA_FLASH_QLA=0 $DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_qwen35_det.json $PYT tests/gpu/test_qwen35_vl_reference.py" ) &
    wait
    grep -H " passed\| failed\| error" "$LOGS"/l*.log | grep -v "PASSED\|FAILED" | cut -c1-200
    grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/l*.log | cut -c1-300 | head -30
    grep -h "capture failed\|eager fallbacks" "$LOGS/l6_train_photos_det.log" | cut -c1-250 | tail -4
    head -c 600 "$LOGS/module_path/module_path.json" ;;
T)
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
      R t_teardown 480 "BRIDGE_CUDAGRAPH_LOGS=\$LOGS/teardown BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_teardown.json $PYT tests/gpu/test_teardown.py" ) ;;
esac
table
