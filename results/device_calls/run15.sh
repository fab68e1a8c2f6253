#!/usr/bin/env bash
# Device call 3 (2026-12-01): Bridge-reference (deterministic), the main job packed with graphs and eager, then the
# 2B useful-tokens benchmark alone on the GPU.
set +e
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v -i warn
source scripts/device_lib.sh
export PYTHONPATH=$PWD HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 BRIDGE_CUDAGRAPH_CACHE=/tmp/bcg_cache
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $LOGS/gpu.txt
( R a_bridge_ref_det 150 'NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 BRIDGE_CUDAGRAPH_RESULTS=$LOGS/gpu_bridge_reference.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_bridge_reference.py' ) &
( R b1_main_graphs 150 'MASTER_ADDR=127.0.0.1 MASTER_PORT=29611 bash scripts/run.sh'
  R b2_main_eager 120 'MASTER_ADDR=127.0.0.1 MASTER_PORT=29612 python3 -m bridge_cudagraph train recipes/tiny_qwen3_vl_photos.yaml model.cuda_graph.language.enabled=false model.cuda_graph.vision.enabled=false' ) &
wait
R c_ut_small 400 'BRIDGE_CUDAGRAPH_CACHE=/tmp/bcg_cache_ut python3 -m benchmarks.useful_tokens --out $LOGS/ut_small --model small --seq 4096 --mbs 2 --num-mb 2 --steps 12'
table
