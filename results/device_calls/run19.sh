#!/usr/bin/env bash
# Device call of run 19 (2026-12-01, session 7), from the repository root with .devwheels and .whl carried:
#   bash .devwheels/install.sh >/dev/null && bash results/device_calls/run19.sh
# Phase 1, parallel lanes: where vision graphs part from eager under deterministic kernels (test_vision_padding.py,
# the padded-shapes probe at vision shapes); the vision suite with its new fallback floor; the main job with packed
# language graphs only, deterministic, saved at 15 and resumed from 15 (issue #17 (b)).
# Phase 2, alone: the teardown test (ten Bridge jobs at once).
set +e
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v -i warn
source scripts/device_lib.sh
export PYTHONPATH=$PWD HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
git log -1 --format=%H > $LOGS/commit.txt 2>/dev/null
DET=NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
MAIN='python3 -m bridge_cudagraph train recipes/tiny_qwen3_vl_photos.yaml train.train_iters=30'
LANG='model.cuda_graph.vision.enabled=false'
( R v1_vision_padding_det 240 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_vision_padding_det.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_vision_padding.py"
  R v2_probe_vision 200 "$DET python3 -m benchmarks.padded_shapes_probe --out \$LOGS/padded_shapes_probe_vision.json --shapes vision_tiny,vision_8b --budgets 1024,2048,4096,8192 --max-tokens 8192 --step 256" ) &
( R v3_vision_suite 300 'BRIDGE_CUDAGRAPH_RESULTS=$LOGS/gpu_vision.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_vision_capture.py' ) &
( R m6_language_saved 240 "BRIDGE_CUDAGRAPH_CACHE=/tmp/c6 $DET MASTER_ADDR=127.0.0.1 MASTER_PORT=29616 $MAIN $LANG checkpoint.save=/tmp/ck_l checkpoint.save_interval=15"
  R m6r_language_resumed 200 "BRIDGE_CUDAGRAPH_CACHE=/tmp/c6 $DET MASTER_ADDR=127.0.0.1 MASTER_PORT=29616 $MAIN $LANG checkpoint.load=/tmp/ck_l checkpoint.ckpt_step=15" ) &
wait
R t1_teardown 330 'BRIDGE_CUDAGRAPH_RESULTS=$LOGS/gpu_teardown.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_teardown.py'
for f in m6_language_saved m6r_language_resumed; do
  printf '%-22s ' $f; grep -o 'lm loss: [0-9.E+-]*' $LOGS/$f.log | awk '{printf "%s ", $3}' | cut -c1-200; echo
done
grep -h '^{' $LOGS/v2_probe_vision.log
table
