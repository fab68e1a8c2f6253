#!/usr/bin/env bash
# Device call of run 53 (2026-12-02, session 16, issue #18): the same check at a third shape, micro-batch 1, sequence
# 4096 (before, results/bench/bench.json: upstream 239.1 ms, ours 240.8, paired 1.015x): upstream and ours_fused and
# the paired phase only (no eager, no control: the session's last device seconds).
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run53.sh
set +e
export LOGS=/tmp/dl_run53
source scripts/device_lib.sh
prologue
R b1_seq4096_2b 230 "python3 -m benchmarks.bench --out \$LOGS/bench_2b --configs small-mbs1-seq4096 --variants upstream,ours_fused --paired-with ours_fused --no-control"
bench_summary bench_2b
table
