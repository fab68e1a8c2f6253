#!/usr/bin/env bash
# Device call of run 48 (2026-12-02, session 15, issue #18): the 2B shape the targets are judged on
# (micro-batch 1, sequence 2048) with language graphs over runs of layers (the new default): eager, upstream, ours,
# ours_fused, ours_fused_layer_graphs (one language graph per layer, as before), the control, the paired phase
# upstream vs ours_fused and the lever pair ours_fused_layer_graphs vs ours_fused. The benchmark runs alone; the
# vision suite (its segments now built by capture.common.segment_callables) after it.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run48.sh
set +e
export LOGS=/tmp/dl_run48
source scripts/device_lib.sh
prologue
R b1_runs_2b 400 "python3 -m benchmarks.bench --out \$LOGS/bench_2b --configs small-mbs1-seq2048 --variants eager,upstream,ours,ours_fused,ours_fused_layer_graphs --paired-with ours_fused --lever-pairs ours_fused_layer_graphs:ours_fused"
R t1_vision 150 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_vision.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_vision_capture.py"
bench_summary bench_2b
grep -h " passed\| failed" "$LOGS"/t1_vision.log | tail -2
table
