#!/usr/bin/env bash
# Device call of run 82 (2026-12-03, session 7 of the day), sized to the device time left: the README's main job
# (scripts/run.sh, the tiny photo recipe in Bridge's loop) with the vision ladder derived by the plan
# (model.cuda_graph.vision.token_budgets=null: rungs at most 1.25x apart, only those the data reaches captured)
# instead of the recipe's pinned [1024, 2048, 4096, 8192], then as pinned, one after the other, alone on the GPU.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run82.sh
set +e
export LOGS=/tmp/dl_run82
source scripts/device_lib.sh
prologue
export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
R a_main_derived 200 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29641 bash scripts/run.sh model.cuda_graph.vision.token_budgets=null"
R b_main_pinned 200 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29642 bash scripts/run.sh"
for f in a_main_derived b_main_pinned; do
  echo "== $f"
  grep -h "vision budgets\|vision: graphs\|useful tokens/s\|error\|Traceback" "$LOGS/$f.log" | cut -c1-260 | tail -6
done
table
