#!/usr/bin/env bash
# Device call for issue #35 section 1 (written 2026-12-02, not run yet): the MoE tiny Qwen3-VL under pure M4 through
# Megatron-Bridge's pretrain() on the photo set (recipes/tiny_qwen3_vl_moe_photos.yaml: padded rows, language graphs
# [attn, moe_router, moe_preprocess], vision graphs, dist.use_decentralized_pg=true), 30 iterations graphs on, twice
# graphs off (the eager-vs-eager floor) and graphs on resumed at 20: tests/gpu/test_bridge_loop.py -k moe alone (4
# tests, at most about 8 minutes). Before the fix every run stopped at the first training log ("data parallel group
# (with GTP_remat) is not initialized", Bridge's training_log -> track_moe_metrics).
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run62_moe.sh
set +e
export LOGS=/tmp/dl_run60
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=5'
R t1_bridge_loop_moe 560 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_loop_moe.json $PYT tests/gpu/test_bridge_loop.py -k moe"
grep -h " passed\| failed\| error" "$LOGS"/t1_*.log | grep -v "^PASSED\|^FAILED" | tail -4
grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/t1_*.log | cut -c1-400 | head -16
python3 - "$LOGS/gpu_bridge_loop_moe.json" <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except Exception as error:
    sys.exit(print("no rows:", error))
for r in rows:
    print({k: v for k, v in r.items() if k not in ("evals_on",)})
PY
table
