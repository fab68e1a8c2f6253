#!/usr/bin/env bash
# Device call of run 52 (2026-12-02, session 16, issue #18): the "no configuration slower than before" at a
# second shape, micro-batch 2, sequence 2048 (before, results/bench/bench.json: upstream 253.6 ms, ours 249.3, paired
# 1.028x), with the product as it is now (runs of layers; ours_fused: the fusion Bridge's recipes ask for). eager,
# upstream, ours_fused and the paired phase; no control (the call's time: the session's last device seconds).
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run52.sh
set +e
export LOGS=/tmp/dl_run52
source scripts/device_lib.sh
prologue
R b1_mbs2_2b 420 "python3 -m benchmarks.bench --out \$LOGS/bench_2b --configs small-mbs2-seq2048 --variants eager,upstream,ours_fused --paired-with ours_fused --no-control"
bench_summary bench_2b
table
