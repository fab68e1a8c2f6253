#!/usr/bin/env bash
# Device call of run 24 (2026-12-01, session 8): every one-GPU suite at this session's product code, in parallel
# lanes (as run 18), the README's main command (scripts/run.sh), and the spawn-Manager probe on the device's cores.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run24.sh
set +e
export LOGS=/tmp/dl_run24
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v -i warn
source scripts/device_lib.sh
export PYTHONPATH=$PWD HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $LOGS/gpu.txt
python3 -c "import torch, transformer_engine, megatron.core, megatron.bridge as b; print(torch.__version__, transformer_engine.__version__, megatron.core.__version__, b.__version__)" > $LOGS/versions.txt 2>&1
DET=NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=5'
( R s6_bridge_loop 480 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_loop.json $PYT tests/gpu/test_bridge_loop.py tests/unit/test_host_patches.py" ) &
( R s1_language 300 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_language.json $PYT tests/gpu/test_language_capture.py tests/gpu/test_plan_helpers.py"
  R s2_vision 300 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_vision.json $PYT tests/gpu/test_vision_capture.py"
  R s7_vision_padding_det 200 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_vision_padding_det.json $PYT tests/gpu/test_vision_padding.py" ) &
( R s3_faults_bench 300 "$PYT tests/gpu/test_faults.py benchmarks/tests/test_bench_short.py"
  R s4_bridge_ref_det 200 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_reference.json $PYT tests/gpu/test_bridge_reference.py"
  R s5_packed_det 300 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed_det.json $PYT tests/gpu/test_packed_language.py" ) &
( R m1_run_sh 300 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29641 bash scripts/run.sh"
  R p2_spawn_probe 120 "python3 -m benchmarks.spawn_manager_probe --repeats 3" ) &
wait
table
