#!/usr/bin/env bash
# Device call of run 58 (2026-12-02): the packed ladder in one pool with its top from the data.
# 1. Packed language suite under deterministic kernels (the new ladder test: rungs from the data, one pool, replays
#    out of capture order interleaved with eager fallbacks, a rung captured later; bit-exact against graphs off and
#    Bridge's provider), beside the Bridge-reference vision cases (the vision ladder, a fallback now fails).
# 2. The README's 2B command: every variant, the memory section, and the paired phase now that both models fit.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run58.sh
set +e
export LOGS=/tmp/dl_run58
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=5'
( NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 R t1_packed_det 230 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed_det.json $PYT tests/gpu/test_packed_language.py" ) &
( R t2_reference_vision 230 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_reference_vision.json $PYT tests/gpu/test_bridge_reference.py -k 'vision or language_graphs_match'" ) &
wait
grep -h " passed\| failed\| error" "$LOGS"/t*.log | grep -v "^PASSED\|^FAILED" | tail -4
grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/t*.log | cut -c1-300 | head -12
R b1_ut_small 400 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_small --model small --seq 4096 --mbs 2 --num-mb 2 --steps 12"
grep -h "ours_packed\|eager_packed\|paired\|Memory\|ladder\|estimate\|peak reserved" "$LOGS/ut_small/useful_tokens.md" 2>/dev/null | cut -c1-260 | head -30
table
