#!/usr/bin/env bash
# Device call of run 87 (2026-12-05): every one-GPU suite at 9c19b38 (see results/device_calls/all_suites_draft.sh for why);
# a sixth lane runs the packed MoE suite of branch moe-packed (5bcec31) from its own copy under /tmp/moe.
# (the padded ladder engine, the per-micro-batch context, the vision replay in its helper, the module splits, the
# settings split into one per mechanism, the benchmark harness rewritten). Nothing of these has run on a GPU; this
# call is the first thing the next session with a device runs, before any benchmark. Five lanes share the H200 as
# run 62's did; the deterministic suites under NVTE_ALLOW_NONDETERMINISTIC_ALGO=0; last, the README's main job.
#   cp results/device_calls/all_suites_draft.sh .snap/   (results/ stays home: the call's 64 MiB), then
#   bash .devwheels/install.sh >/dev/null 2>&1; bash .snap/all_suites_draft.sh
set +e
export LOGS=/tmp/dl_run87
source scripts/device_lib.sh
prologue
DET=NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
  R l1_bridge_loop 380 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_loop.json $PYT tests/gpu/test_bridge_loop.py -k 'not moe'"
  R l1_faults 120 "$PYT tests/gpu/test_faults.py" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c2
  R l2_bridge_loop_moe 540 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_loop_moe.json $PYT tests/gpu/test_bridge_loop.py -k moe" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c3
  R l3_teardown 400 "BRIDGE_CUDAGRAPH_LOGS=\$LOGS/teardown BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_teardown.json $PYT tests/gpu/test_teardown.py"
  R l3_run_sh 150 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29641 bash scripts/run.sh" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c4
  R l4_language 200 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_language.json $PYT tests/gpu/test_language_capture.py tests/gpu/test_plan_helpers.py"
  R l4_vision 180 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_vision.json $PYT tests/gpu/test_vision_capture.py"
  R l4_optimizer 150 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_optimizer.json $PYT tests/gpu/test_optimizer_host_step.py tests/gpu/test_optimizer_graph.py" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c5
  R l5_packed_det 250 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed_det.json $PYT tests/gpu/test_packed_language.py"
  R l5_reference_det 180 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_reference_det.json $PYT tests/gpu/test_bridge_reference.py"
  R l5_vision_padding_det 120 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_vision_padding_det.json $PYT tests/gpu/test_vision_padding.py" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c6 NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
  mkdir -p /tmp/moe && tar -xzf .snap/moe-packed.tgz -C /tmp/moe && cp -r .whl /tmp/moe/ 2>/dev/null
  R l6_moe_packed_det 420 "cd /tmp/moe && BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_moe_packed_det.json PYTHONPATH=/tmp/moe $PYT tests/gpu/test_packed_moe.py" ) &
wait
grep -H " passed\| failed\| error" "$LOGS"/l*.log | grep -v "PASSED\|FAILED" | cut -c1-200
grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/l*.log | cut -c1-300 | head -30
table
# Then, in a second call, alone on the GPU: the 2B benchmark with the padded ladder beside megatron-core's helper,
# every parameter's gradient against the floor, 17 steps (the proof #46 asks for), e.g.
#   python3 -m benchmarks.useful_tokens --out $LOGS/ut --model small --seq 4096 --mbs 2 --num-mb 2 --steps 17 \
#     --warmup 3 --profile-steps 2 --no-control --variants eager_packed,eager_padded,ours_padded,\
#     ours_padded_layer_graphs,ours_padded_megatron,eager_padded_repeat,ours_packed
# with the way train takes to its first replay (the house's target: at most 20 modules):
#   python3 -m benchmarks.module_path recipes/tiny_qwen3_vl_photos.yaml --out $LOGS/module_path
# and a third: det_vision_draft.sh's train step, run_conversations_draft.sh, moe_packed_draft.sh (branch moe-packed).
