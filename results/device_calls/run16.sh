#!/usr/bin/env bash
# Device call 4 (2026-12-01): the main job under deterministic kernels, graphs vs eager, 30 iterations; the language,
# vision and packed GPU tests at the final code, in parallel lanes.
set +e
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v -i warn
source scripts/device_lib.sh
export PYTHONPATH=$PWD HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 BRIDGE_CUDAGRAPH_CACHE=/tmp/bcg_cache
git log -1 --format=%H > $LOGS/commit.txt 2>/dev/null
( R a1_main_graphs_det 200 'NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29611 python3 -m bridge_cudagraph train recipes/tiny_qwen3_vl_photos.yaml train.train_iters=30' ) &
( R a2_main_eager_det 200 'BRIDGE_CUDAGRAPH_CACHE=/tmp/bcg_b NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29612 python3 -m bridge_cudagraph train recipes/tiny_qwen3_vl_photos.yaml train.train_iters=30 model.cuda_graph.language.enabled=false model.cuda_graph.vision.enabled=false' ) &
( R b_language 200 'BRIDGE_CUDAGRAPH_RESULTS=$LOGS/gpu_language.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_language_capture.py tests/gpu/test_plan_helpers.py' ) &
( R c_vision 200 'BRIDGE_CUDAGRAPH_RESULTS=$LOGS/gpu_vision.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_vision_capture.py' ) &
( R d_packed_det 200 'NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 BRIDGE_CUDAGRAPH_RESULTS=$LOGS/gpu_packed_det.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_packed_language.py' ) &
wait
table
