#!/usr/bin/env bash
# Device call of run 47 (2026-12-02, session 15, issue #18): language graphs over runs of layers
# (model.cuda_graph.language.graph_unit, default deepstack: one graph per run of layers that no deepstack merge
# interrupts). Two lanes on the one GPU: (A) the Bridge-reference suite under deterministic kernels (the plugin's
# language graphs, now runs, bit for bit Bridge's unmodified model), then Bridge's loop (the callback builds the
# helpers from the plan: runs in every graphed run); (B) the language capture suite (runs and per-layer graphs
# against the graphs-off model, GPT and Qwen3-VL), the packed suite under deterministic kernels (a runs case added;
# GPT offline packing now one run), the README's main command.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run47.sh
set +e
export LOGS=/tmp/dl_run47
source scripts/device_lib.sh
prologue
( NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 R t1_reference 130 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_reference.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_bridge_reference.py"
  R t2_bridge_loop 330 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_loop.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_bridge_loop.py" ) &
( R t3_language 190 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_language.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_language_capture.py"
  NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 R t4_packed 190 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_packed_language.py"
  R m1_run_sh 150 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29641 bash scripts/run.sh" ) &
wait
grep -h " passed\| failed\| error" "$LOGS"/t*.log | grep -v "^PASSED\|^FAILED" | tail -8
grep -h "^FAILED\|^ERROR" "$LOGS"/t*.log | cut -c1-300 | head -12
grep -n "useful tokens\|graphs.*replays\|Traceback\|error" "$LOGS"/m1_run_sh.log | tail -6 | cut -c1-250
table
