#!/usr/bin/env bash
# Device call of run 84 (2026-12-04): #46's fix proved. Every capture keeps TE's clone of the returned parameter
# gradients (DDP's hooks, which add them on their own stream, raced the next replays in TE's shared pool: run 83).
# In parallel lanes: (1) the language capture suite, with the new test that holds DDP's stream back and shows the
# control (the clone off, as before) losing gradients; (2) under NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 the packed ladder
# and vision suites' cases that capture and sum parameter gradients, and the Bridge-reference suite; (3) the 2B
# useful-tokens benchmark, 17 measured steps, every parameter's gradient on the fixed micro-batch against the floor:
# eager_padded, ours_padded, eager_padded_repeat (the padded loss curve's floor), eager_packed, ours_packed.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash .snap/run84.sh
set +e
export LOGS=/tmp/dl_run84
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
  R a_language 420 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_language.json $PYT tests/gpu/test_language_capture.py" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c2 NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
  R b_packed_det 250 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed_det.json $PYT tests/gpu/test_packed_language.py -k 'ladder_rungs or fewer_waits or tight'"
  R c_reference_det 220 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_reference_det.json $PYT tests/gpu/test_bridge_reference.py" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c3
  R d_ut_grads 520 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_grads --model small --seq 4096 --mbs 2 --num-mb 2 --steps 17 --warmup 3 --profile-steps 0 --no-paired --no-control --variants eager_padded,ours_padded,eager_padded_repeat,eager_packed,ours_packed" ) &
wait
grep -H " passed\| failed\| error" "$LOGS"/*.log | grep -v "PASSED\|FAILED" | cut -c1-200
grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/*.log | cut -c1-300 | head -20
python3 - "$LOGS/ut_grads/useful_tokens.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for name, v in d["variants"].items():
    p = v.get("parity") or {}
    f = p.get("fixed_batch") or {}
    g = f.get("grads") or {}
    st = p.get("steps") or {}
    print(f"{name:22s} {v.get('status')} norm {p.get('fixed_batch_grad_norm')} loss {f.get('loss_max_abs')} "
          f"exact {g.get('grad_exact_fraction')} max {g.get('grad_max_rel_l2')} floor {f.get('floor_grad_max_rel_l2')} "
          f"within {f.get('within_floor')} steps max_rel {st.get('max_rel')} err {str(v.get('error'))[:120]}")
PY
table
