#!/usr/bin/env bash
# Device call of run 49 (2026-12-02, session 15, issue #18): each graph's parameter gradients summed into main_grad
# once per replay (model.cuda_graph.param_grads_per_graph, on by default: capture/grad_sink.py), on top of the runs of
# layers. One call for the session's last device time: first two lanes of parity on the one GPU, (A) the
# Bridge-reference suite under deterministic kernels, then Bridge's loop (the tiny recipe overlaps the gradient
# reduction: readiness comes from the sink); (B) the language suite, the packed suite under deterministic kernels (the
# runs case with the sink). Then, alone on the GPU, the 2B shape (micro-batch 1, sequence 2048): eager, upstream,
# ours_fused, ours_fused_param_hooks (a node and a DDP hook per parameter, as before), the control, the paired phase
# upstream vs ours_fused and the lever pair ours_fused_param_hooks vs ours_fused.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run49.sh
set +e
export LOGS=/tmp/dl_run49
source scripts/device_lib.sh
prologue
( NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 R t1_reference 110 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_reference.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_bridge_reference.py"
  R t2_bridge_loop 250 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_loop.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_bridge_loop.py" ) &
( R t3_language 150 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_language.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_language_capture.py"
  NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 R t4_packed 160 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_packed_language.py" ) &
wait
grep -h " passed\| failed\| error" "$LOGS"/t*.log | grep -v "^PASSED\|^FAILED" | tail -6
grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/t*.log | cut -c1-300 | head -12
R b1_sink_2b 300 "python3 -m benchmarks.bench --out \$LOGS/bench_2b --configs small-mbs1-seq2048 --variants eager,upstream,ours_fused,ours_fused_param_hooks --paired-with ours_fused --lever-pairs ours_fused_param_hooks:ours_fused"
bench_summary bench_2b
table
