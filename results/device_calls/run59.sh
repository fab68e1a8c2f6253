#!/usr/bin/env bash
# Device call of run 59 (2026-12-02): run 58 again after its fix (the ladder called capture_one without the copy
# index: every packed and vision capture failed at once, nothing else was measured). The packed suite first; when it
# fails, nothing else runs.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run59.sh
set +e
export LOGS=/tmp/dl_run59
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=5'
( NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 R t1_packed_det 230 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed_det.json $PYT tests/gpu/test_packed_language.py" ) &
( R t2_reference_vision 230 "NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_reference_vision.json $PYT tests/gpu/test_bridge_reference.py -k 'vision or language_graphs_match'" ) &
wait
grep -h " passed\| failed\| error" "$LOGS"/t*.log | grep -v "^PASSED\|^FAILED" | tail -4
grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/t*.log | cut -c1-400 | head -16
python3 - "$LOGS/gpu_packed_det.json" <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except Exception as error:
    sys.exit(print("no rows:", error))
for r in rows:
    if r.get("case") in ("ladder memory", "ladder grown"):
        print({k: v for k, v in r.items() if k != "test"})
PY
if grep -q " failed\|^ERROR" "$LOGS/t1_packed_det.log"; then table; exit 1; fi
R b1_ut_small 420 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_small --model small --seq 4096 --mbs 2 --num-mb 2 --steps 12"
grep -h "ours_packed\|eager_packed\|paired\|ladder\|estimate\|peak reserved\|before step" "$LOGS/ut_small/useful_tokens.md" 2>/dev/null | cut -c1-300 | head -30
table
