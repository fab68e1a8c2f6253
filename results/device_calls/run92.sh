#!/usr/bin/env bash
# Run 92: the packed MoE suite under deterministic kernels, every case recorded before it fails (run 91: fill_30's
# first replay 15 tokens 1 ulp off, gradients exact), with the graphs-off model compared across the capture; then,
# alone on the GPU, #46's padded 2B variants (run 91 on an H100 lost them to the lanes beside them).
set +e
export LOGS=/tmp/dl_run92
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
R a_moe_packed_det 100 "NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_moe_packed_det.json $PYT tests/gpu/test_packed_moe.py -k graphs_match"
python3 - <<'PY'
import json, os
p = os.path.join(os.environ["LOGS"], "gpu_moe_packed_det.json")
if os.path.exists(p):
    for r in json.load(open(p))["rows"]:
        print({k: r.get(k) for k in ("case", "loss_exact", "loss_tokens_differ", "loss_tokens_differ_kept", "loss_worst_index", "loss_worst_mask", "grad_exact_fraction", "budget", "tail")})
PY
R b_ut_2b_padded 450 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut --model small --seq 4096 --mbs 2 --num-mb 2 --steps 17 --warmup 3 --profile-steps 0 --no-paired --no-control --variants eager_packed,eager_padded,ours_padded,eager_padded_repeat,ours_padded_megatron"
sed -n '/^| variant/,/^$/p' "$LOGS/ut/useful_tokens.md" | cut -c1-330
table
