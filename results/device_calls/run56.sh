#!/usr/bin/env bash
# Device call of run 56 (2026-12-02, session 17, issue #18): "no configuration of the benchmark slower than before"
# at sequence 4096, not measured since the forward lever, the runs of layers and the row merge (run 53 was cut):
# micro-batch 1 (eager, upstream, ours_fused and their paired phase) then micro-batch 2 (the paired phase skips
# itself: both models need about 143 GiB), no control; the benchmark writes each configuration as it finishes.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run56.sh
set +e
export LOGS=/tmp/dl_run56
source scripts/device_lib.sh
prologue
R b1_seq4096_2b 500 "python3 -m benchmarks.bench --out \$LOGS/bench_2b --configs small-mbs1-seq4096,small-mbs2-seq4096 --variants eager,upstream,ours_fused --paired-with ours_fused --no-control"
bench_summary bench_2b
table
