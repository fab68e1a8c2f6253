#!/usr/bin/env bash
# Device call of run 51 (2026-12-02, session 16, issue #18): the vision encoder's weight gradients fused into
# main_grad (model.cuda_graph.vision.gradient_accumulation_fusion, opt-in). First its parity: the Bridge-reference
# suite under deterministic kernels (the new case: vision graphs with the fusion bit for bit Bridge's model with TE's
# fusion on in the same encoder modules). Then alone on the GPU, the 2B shape (micro-batch 1, sequence 2048): eager,
# upstream, ours_fused, ours_fused_vision_wgrad, the control, the paired phase upstream vs ours_fused and the lever
# pair ours_fused_vision_wgrad vs ours_fused.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run51.sh
set +e
export LOGS=/tmp/dl_run51
source scripts/device_lib.sh
prologue
NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 R t1_reference 120 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_reference.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_bridge_reference.py"
grep -h " passed\| failed\| error" "$LOGS"/t*.log | grep -v "^PASSED\|^FAILED" | tail -3
grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/t*.log | cut -c1-300 | head -12
R b1_vision_wgrad_2b 330 "python3 -m benchmarks.bench --out \$LOGS/bench_2b --configs small-mbs1-seq2048 --variants eager,upstream,ours_fused,ours_fused_vision_wgrad --paired-with ours_fused --lever-pairs ours_fused_vision_wgrad:ours_fused"
bench_summary bench_2b
table
