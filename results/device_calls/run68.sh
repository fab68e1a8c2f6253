#!/usr/bin/env bash
# Device call of run 68 (2026-12-03, session 4 of the day): #36, where the packed step's host time comes from, and
# the checks the last session left unrun.
# (1) two lanes: the packed language suite under NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 (the tight-packing test now
#     asserts every gradient exact; the ladder test now asserts a late re-capture gives the old pool back), and
#     benchmarks/autograd_sites.py on the 2B shape (which lines create the packed step's autograd nodes:
#     IndexBackward0, AccumulateGrad, ... by creation site; not a timing);
# (2) alone on the GPU: megatron-core's full-iteration graph on the tiny, host-bound GPT offline-packed config
#     (benchmarks/gpt_full_iteration.py --configs tiny), eager and our packed graphs beside it.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run68.sh
set +e
export LOGS=/tmp/dl_run68
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1 NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
  R a_packed_det 240 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed_det.json $PYT tests/gpu/test_packed_language.py" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c2
  R b_autograd_sites 240 "python3 -m benchmarks.autograd_sites --out \$LOGS/sites --model small --seq 4096 --mbs 2 --num-mb 2 --steps 1 --warmup 3 --profile-steps 0 --variants eager_packed,ours_packed" ) &
wait
export BRIDGE_CUDAGRAPH_CACHE=/tmp/c3
R c_gpt_tiny_full_iteration 150 "python3 -m benchmarks.gpt_full_iteration --out \$LOGS/gpt_fi_tiny --configs tiny --steps 20 --warmup 3 --profile-steps 1"
grep -H " passed\| failed\| error" "$LOGS"/*.log | grep -v "PASSED\|FAILED" | cut -c1-200
grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/*.log | cut -c1-300 | head -20
sed -n '/^eager_packed: /,$p' "$LOGS/b_autograd_sites.log" | cut -c1-230 | head -80
grep -h "^|" "$LOGS/gpt_fi_tiny/gpt_full_iteration.md" 2>/dev/null | cut -c1-330 | head -12
table
