#!/usr/bin/env bash
# Device call of run 14 (2026-12-01), as run from a copy of the tree in .snap/ (carried with .devwheels and .whl):
#   bash .devwheels/install.sh && bash .snap/dev2.sh
set +e
cd "$(dirname "$0")"
python3 -m pip install -q --no-index --no-deps ../.whl/*.whl 2>&1 | grep -v -i warn
source scripts/device_lib.sh
export PYTHONPATH=$PWD HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 BRIDGE_CUDAGRAPH_CACHE=/tmp/bcg_cache
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $LOGS/gpu.txt
( R a1_packed_det 150 'NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 BRIDGE_CUDAGRAPH_RESULTS=$LOGS/gpu_packed_det.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_packed_language.py'
  R a2_bridge_ref_det 150 'NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 BRIDGE_CUDAGRAPH_RESULTS=$LOGS/gpu_bridge_reference.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_bridge_reference.py'
  R a3_main_graphs 170 'MASTER_ADDR=127.0.0.1 MASTER_PORT=29611 python3 -m bridge_cudagraph train recipes/tiny_qwen3_vl_photos.yaml'
  R a4_main_eager 140 'MASTER_ADDR=127.0.0.1 MASTER_PORT=29612 python3 -m bridge_cudagraph train recipes/tiny_qwen3_vl_photos.yaml model.cuda_graph.language.enabled=false model.cuda_graph.vision.enabled=false' ) &
( R b1_language 280 'BRIDGE_CUDAGRAPH_RESULTS=$LOGS/gpu_language.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_language_capture.py tests/gpu/test_plan_helpers.py'
  R b2_faults_bench 250 'python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_faults.py benchmarks/tests/test_bench_short.py' ) &
( R c1_vision 330 'BRIDGE_CUDAGRAPH_RESULTS=$LOGS/gpu_vision.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_vision_capture.py'
  R c2_ut_tiny 200 'BRIDGE_CUDAGRAPH_CACHE=/tmp/bcg_cache_ut python3 -m benchmarks.useful_tokens --out $LOGS/ut_tiny --model tiny' ) &
( R d1_bridge_loop 420 'BRIDGE_CUDAGRAPH_RESULTS=$LOGS/gpu_bridge_loop.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_bridge_loop.py tests/unit/test_host_patches.py' ) &
wait
table
