#!/usr/bin/env bash
# Device call of run 29 (2026-12-01, session 9): GPT SFT offline packing under packed language graphs (the GPU test,
# deterministic, and Bridge's pretrain() on recipes/tiny_gpt_packed.yaml, graphs vs eager vs eager, 30 iterations,
# deterministic), and the one-GPU suites at the merged no-import-cycles tree (Bridge loop + host patches; language,
# vision with the LoRA test, packed deterministic; faults + short bench; Bridge reference; the README's main job).
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run29.sh
set +e
export LOGS=/tmp/dl_run29
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v -i warn
source scripts/device_lib.sh
export PYTHONPATH=$PWD HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $LOGS/gpu.txt
python3 -c "import torch, transformer_engine, megatron.core, megatron.bridge as b; print(torch.__version__, transformer_engine.__version__, megatron.core.__version__, b.__version__)" > $LOGS/versions.txt 2>&1
DET=NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=5'
GPT='python3 -m bridge_cudagraph train recipes/tiny_gpt_packed.yaml train.train_iters=30'
( R g0_gpt_packed_det 120 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_gpt_packed_det.json $PYT tests/gpu/test_packed_language.py -k offline"
  R g1_gpt_graphs 100 "BRIDGE_CUDAGRAPH_CACHE=/tmp/c1 $DET MASTER_ADDR=127.0.0.1 MASTER_PORT=29621 $GPT"
  R g2_gpt_eager 100 "BRIDGE_CUDAGRAPH_CACHE=/tmp/c2 $DET MASTER_ADDR=127.0.0.1 MASTER_PORT=29622 $GPT model.cuda_graph.language.enabled=false"
  R g3_gpt_eager_again 100 "BRIDGE_CUDAGRAPH_CACHE=/tmp/c3 $DET MASTER_ADDR=127.0.0.1 MASTER_PORT=29623 $GPT model.cuda_graph.language.enabled=false"
  R g4_gpt_compare 20 "python3 -m benchmarks.loop_logs --out \$LOGS/gpt_loop.json --reference \$LOGS/g2_gpt_eager.log --floor \$LOGS/g3_gpt_eager_again.log \$LOGS/g1_gpt_graphs.log" ) &
( R s6_bridge_loop 420 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_loop.json $PYT tests/gpu/test_bridge_loop.py tests/unit/test_host_patches.py" ) &
( R s1_language 150 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_language.json $PYT tests/gpu/test_language_capture.py tests/gpu/test_plan_helpers.py"
  R s2_vision 170 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_vision.json $PYT tests/gpu/test_vision_capture.py"
  R s5_packed_det 150 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed_det.json $PYT tests/gpu/test_packed_language.py -k 'not offline'" ) &
( R s3_faults_bench 150 "$PYT tests/gpu/test_faults.py benchmarks/tests/test_bench_short.py"
  R s4_bridge_ref_det 100 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_reference.json $PYT tests/gpu/test_bridge_reference.py"
  R m1_run_sh 180 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29641 bash scripts/run.sh" ) &
wait
for f in g1_gpt_graphs g2_gpt_eager g3_gpt_eager_again; do
  printf '%-20s ' $f; grep -o 'lm loss: [0-9.E+-]*' $LOGS/$f.log | awk '{printf "%s ", $3}' | cut -c1-160; echo
done
table
