#!/usr/bin/env bash
# Device call of run 74 (2026-12-03, session 5 of the day): the README's main job (scripts/run.sh: the tiny photo
# recipe, packed through Bridge's Qwen3-VL data path and its real loop, graphs on) with its vision ladder now derived
# and the step's packed rows handed flat; the callback prints how many forwards took each part of fewer_host_waits.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run74.sh
set +e
export LOGS=/tmp/dl_run74
source scripts/device_lib.sh
prologue
export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
R a_run_sh 200 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29641 bash scripts/run.sh"
grep -h "fewer_host_waits:\|captured\|error\|Traceback\| iteration  *20/\|deleted the" "$LOGS/a_run_sh.log" | cut -c1-300 | head -20
table
