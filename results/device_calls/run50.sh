#!/usr/bin/env bash
# Device call of run 50 (2026-12-02, session 16, issue #18): what run 49's killed benchmark did not measure, first and
# alone on the GPU: the 2B shape (micro-batch 1, sequence 2048) with eager, upstream, ours_fused and
# ours_fused_grads_per_graph (each graph's parameter gradients summed into main_grad once per replay,
# model.cuda_graph.param_grads_per_graph), the control, the paired phase upstream vs ours_fused and the lever pair
# ours_fused_grads_per_graph vs ours_fused. Then, in two lanes, the review changes of session 15 that no GPU ran yet:
# (A) the Bridge-reference suite under deterministic kernels, (B) the language suite (both units, sink on and off).
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run50.sh
set +e
export LOGS=/tmp/dl_run50
source scripts/device_lib.sh
prologue
R b1_sink_2b 330 "python3 -m benchmarks.bench --out \$LOGS/bench_2b --configs small-mbs1-seq2048 --variants eager,upstream,ours_fused,ours_fused_grads_per_graph --paired-with ours_fused --lever-pairs ours_fused_grads_per_graph:ours_fused"
( NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 R t1_reference 120 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_reference.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_bridge_reference.py" ) &
( R t3_language 150 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_language.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_language_capture.py" ) &
wait
grep -h " passed\| failed\| error" "$LOGS"/t*.log | grep -v "^PASSED\|^FAILED" | tail -6
grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/t*.log | cut -c1-300 | head -12
bench_summary bench_2b
table
