#!/usr/bin/env bash
# Device call of run 62 (2026-12-03): every GPU suite at the folders-by-concern tree (issue #34: the moves are
# mechanical, only a GPU run shows it) with the one-pool ladder of #33, and the MoE tiny Qwen3-VL under pure M4
# through Bridge's pretrain() (#35 section 1: 30 iterations graphs on, twice graphs off, graphs on resumed at 20).
# Five lanes share the one H200 (the tiny models leave it mostly idle; run 29 ran four lanes the same way); each lane
# has its own dataset cache; the deterministic suites run under NVTE_ALLOW_NONDETERMINISTIC_ALGO=0; last, the README's
# main job (scripts/run.sh) as a fresh machine runs it.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run62.sh
set +e
export LOGS=/tmp/dl_run62
source scripts/device_lib.sh
prologue
DET=NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
  R l1_bridge_loop 380 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_loop.json $PYT tests/gpu/test_bridge_loop.py -k 'not moe'"
  R l1_faults_bench 160 "$PYT tests/gpu/test_faults.py benchmarks/tests/test_bench_short.py" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c2
  R l2_bridge_loop_moe 550 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_loop_moe.json $PYT tests/gpu/test_bridge_loop.py -k moe" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c3
  R l3_teardown 400 "BRIDGE_CUDAGRAPH_LOGS=\$LOGS/teardown BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_teardown.json $PYT tests/gpu/test_teardown.py"
  R l3_run_sh 150 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29641 bash scripts/run.sh" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c4
  R l4_language 170 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_language.json $PYT tests/gpu/test_language_capture.py tests/gpu/test_plan_helpers.py"
  R l4_vision 180 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_vision.json $PYT tests/gpu/test_vision_capture.py"
  R l4_optimizer 180 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_optimizer.json $PYT tests/gpu/test_optimizer_host_step.py tests/gpu/test_optimizer_graph.py" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c5
  R l5_packed_det 250 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed_det.json $PYT tests/gpu/test_packed_language.py"
  R l5_reference_det 150 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_reference_det.json $PYT tests/gpu/test_bridge_reference.py"
  R l5_vision_padding_det 120 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_vision_padding_det.json $PYT tests/gpu/test_vision_padding.py" ) &
wait
grep -H " passed\| failed\| error" "$LOGS"/l*.log | grep -v "PASSED\|FAILED" | cut -c1-200
grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/l*.log | cut -c1-300 | head -24
python3 - "$LOGS/gpu_bridge_loop_moe.json" <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except Exception as error:
    sys.exit(print("no moe rows:", error))
for r in rows:
    print({k: v for k, v in r.items() if k not in ("evals_on", "losses", "series")})
PY
table
