#!/usr/bin/env bash
# Device call of run 44 (2026-12-02, session 14, issue #18): Qwen3-VL's forward with fewer host waits, now filling
# the mRoPE positions just before the input embedding (the host copies wait on an event while the vision encoder
# runs) and with the text-only positions fixed (run 43: an expanded view could not be pinned). Two lanes on the one
# GPU: (A) the Bridge-reference waits test, then Bridge's loop (7 runs; the graphed ones take the forward from the
# callback); (B) the packed waits test, the README's main command, the whole Bridge-reference suite. All GPU tests
# under deterministic kernels except the loop and the main job, as in runs 29 and 40.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run44.sh
set +e
export LOGS=/tmp/dl_run44
source scripts/device_lib.sh
prologue
( NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 R t1_reference_waits 150 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_reference_waits.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_bridge_reference.py -k 'host_waits or wait_at_most'"
  R t3_bridge_loop 380 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_loop.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_bridge_loop.py" ) &
( NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 R t2_packed_waits 150 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed_waits.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_packed_language.py -k 'fewer_waits or max_seqlen_S_fused'"
  R m1_run_sh 200 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29641 bash scripts/run.sh"
  NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 R t4_reference_all 150 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_reference_all.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_bridge_reference.py" ) &
wait
python3 - <<'PY'
import json, os
for f in ("gpu_reference_waits.json", "gpu_packed_waits.json", "gpu_bridge_loop.json", "gpu_reference_all.json"):
    path = os.path.join(os.environ["LOGS"], f)
    if os.path.exists(path):
        d = json.load(open(path))
        print(f, "exit", d["meta"].get("exitstatus"))
        for row in d["rows"]:
            if "wait" in json.dumps(row) or "host_positions" in json.dumps(row) or "graphs_on" in json.dumps(row):
                print("  ", json.dumps(row)[:260])
PY
grep -h "passed\|failed" "$LOGS"/t*.log | grep -v "^PASSED\|^FAILED" | tail -6
grep -n "useful tokens\|graphs\b.*replays\|error" "$LOGS"/m1_run_sh.log | tail -5 | cut -c1-250
table
