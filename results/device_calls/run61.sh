#!/usr/bin/env bash
# Device call of run 61 (2026-12-02): the ladder grown by a re-capture up to the new top (run 60's 8B LoRA run grew
# its pool from 9.4 to 13.2 GiB adding one rung above the others): the two ladder tests of the packed suite under
# deterministic kernels.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run61.sh
set +e
export LOGS=/tmp/dl_run61
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=5'
NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 R t1_ladder_det 200 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_ladder_det.json $PYT tests/gpu/test_packed_language.py -k ladder"
grep -h " passed\| failed\| error" "$LOGS"/t*.log | grep -v "^PASSED\|^FAILED" | tail -3
grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/t*.log | cut -c1-400 | head -12
python3 - "$LOGS/gpu_ladder_det.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    if r.get("case") in ("ladder memory", "ladder grown"):
        print({k: v for k, v in r.items() if k != "test"})
PY
table
