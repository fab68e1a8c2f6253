#!/usr/bin/env bash
# Run 93: the packed MoE suite with its references evaluated beside each replay (run 92: the graphs-off model's own
# loss moved 1 ulp on one batch across the capture; the replays equalled Bridge's model bit for bit), with and without
# deterministic kernels, and the dense packed ladder test that ran out of memory in runs 90 and 91 (shared GPU).
set +e
export LOGS=/tmp/dl_run93
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
  R a_moe_packed_det 150 "NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_moe_packed_det.json $PYT tests/gpu/test_packed_moe.py" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c2
  R b_moe_packed 150 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_moe_packed.json $PYT tests/gpu/test_packed_moe.py" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c3
  R c_packed_ladder_det 150 "NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed_ladder_det.json $PYT tests/gpu/test_packed_language.py -k ladder_rungs_share" ) &
wait
grep -h "^FAILED\|^E  " "$LOGS"/*.log | cut -c1-300 | head -12
python3 - <<'PY'
import json, os
for f in ("gpu_moe_packed_det.json", "gpu_moe_packed.json"):
    p = os.path.join(os.environ["LOGS"], f)
    if os.path.exists(p):
        for r in json.load(open(p))["rows"]:
            if r.get("loss_exact") is False or r.get("loss_tokens_differ"):
                print(f, {k: r.get(k) for k in ("case", "loss_max_abs", "loss_tokens_differ", "loss_tokens_differ_kept", "loss_worst_index", "grad_exact_fraction")})
PY
table
