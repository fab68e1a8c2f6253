#!/usr/bin/env bash
# Device call of run 33 (2026-12-01, session 10, issue #18): the levers against each other in paired phases on the
# 2B shape (micro-batch 1, sequence 2048). Run 32's separate runs could not rank them: its eager step was 475 ms
# against 381 ms in run 31 (same code, same shape), so a few percent between two levers is noise there.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run33.sh
set +e
export LOGS=/tmp/dl_run33
source scripts/device_lib.sh
prologue
R b1_lever_pairs 290 "python3 -m benchmarks.bench --out \$LOGS/bench_pairs --configs small-mbs1-seq2048 --variants ours_per_layer,ours,ours_optgraph --no-control --no-profile --measured-steps 20 --lever-pairs ours_per_layer:ours,ours:ours_optgraph"
grep -E "paired|small-mbs1-seq2048 \|" $LOGS/b1_lever_pairs.log | tail -12
table
