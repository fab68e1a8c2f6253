#!/usr/bin/env bash
# Device call of run 18 (2026-12-01, session 7), from the repository root with .devwheels and .whl carried:
#   bash .devwheels/install.sh >/dev/null && bash results/device_calls/run18.sh
# Lanes in parallel on one H200:
#   * issue #17 (a), (b): the main job (packed photo fine-tune in Bridge's pretrain()) under deterministic kernels,
#     30 iterations: graphs on, eager twice, language graphs only, vision graphs only; graphs-on and eager save at
#     15 and are resumed from 15 to 30 with the same setting; the padded-shapes probe of TE's modules;
#   * issue #16: the one-GPU suites at this commit (the teardown test runs in a later call: it runs ten Bridge jobs
#     at once and needs the machine to itself).
set +e
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v -i warn
source scripts/device_lib.sh
export PYTHONPATH=$PWD HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
git log -1 --format=%H > $LOGS/commit.txt 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $LOGS/gpu.txt
python3 -c "import torch, transformer_engine, megatron.core, megatron.bridge as b; print(torch.__version__, transformer_engine.__version__, megatron.core.__version__, b.__version__)" > $LOGS/versions.txt 2>&1
DET=NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
MAIN='python3 -m bridge_cudagraph train recipes/tiny_qwen3_vl_photos.yaml train.train_iters=30'
OFF='model.cuda_graph.language.enabled=false model.cuda_graph.vision.enabled=false'
( R m1_graphs 240 "BRIDGE_CUDAGRAPH_CACHE=/tmp/c1 $DET MASTER_ADDR=127.0.0.1 MASTER_PORT=29611 $MAIN checkpoint.save=/tmp/ck_g checkpoint.save_interval=15"
  R m1r_graphs_resumed 200 "BRIDGE_CUDAGRAPH_CACHE=/tmp/c1 $DET MASTER_ADDR=127.0.0.1 MASTER_PORT=29611 $MAIN checkpoint.load=/tmp/ck_g checkpoint.ckpt_step=15" ) &
( R m2_eager 240 "BRIDGE_CUDAGRAPH_CACHE=/tmp/c2 $DET MASTER_ADDR=127.0.0.1 MASTER_PORT=29612 $MAIN $OFF checkpoint.save=/tmp/ck_e checkpoint.save_interval=15"
  R m2r_eager_resumed 200 "BRIDGE_CUDAGRAPH_CACHE=/tmp/c2 $DET MASTER_ADDR=127.0.0.1 MASTER_PORT=29612 $MAIN $OFF checkpoint.load=/tmp/ck_e checkpoint.ckpt_step=15" ) &
( R m3_eager_again 240 "BRIDGE_CUDAGRAPH_CACHE=/tmp/c3 $DET MASTER_ADDR=127.0.0.1 MASTER_PORT=29613 $MAIN $OFF"
  R m4_language_only 240 "BRIDGE_CUDAGRAPH_CACHE=/tmp/c3 $DET MASTER_ADDR=127.0.0.1 MASTER_PORT=29613 $MAIN model.cuda_graph.vision.enabled=false" ) &
( R m5_vision_only 240 "BRIDGE_CUDAGRAPH_CACHE=/tmp/c5 $DET MASTER_ADDR=127.0.0.1 MASTER_PORT=29615 $MAIN model.cuda_graph.language.enabled=false"
  R p1_padded_probe 200 "$DET python3 -m benchmarks.padded_shapes_probe --out $LOGS/padded_shapes_probe.json" ) &
( R s1_language 300 'BRIDGE_CUDAGRAPH_RESULTS=$LOGS/gpu_language.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_language_capture.py tests/gpu/test_plan_helpers.py'
  R s2_vision 300 'BRIDGE_CUDAGRAPH_RESULTS=$LOGS/gpu_vision.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_vision_capture.py' ) &
( R s3_faults_bench 300 'python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_faults.py benchmarks/tests/test_bench_short.py'
  R s4_bridge_ref_det 200 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_reference.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_bridge_reference.py" ) &
( R s5_packed_det 300 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed_det.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_packed_language.py" ) &
( R s6_bridge_loop 480 'BRIDGE_CUDAGRAPH_RESULTS=$LOGS/gpu_bridge_loop.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_bridge_loop.py tests/unit/test_host_patches.py' ) &
wait
for f in m1_graphs m2_eager m3_eager_again m4_language_only m5_vision_only m1r_graphs_resumed m2r_eager_resumed; do
  printf '%-20s ' $f; grep -o 'lm loss: [0-9.E+-]*' $LOGS/$f.log | awk '{printf "%s ", $3}' | cut -c1-200; echo
done
table
