#!/usr/bin/env bash
# Run 91: what run 90 (S) lost to memory shared by seven lanes: #46's 2B benchmark (padded and packed gradients and
# floors, the padded ladder beside megatron-core's helper, the step-loss floor), and beside its first variants the
# packed MoE suite with and without deterministic kernels (now recording where a per-token loss differs) and the
# packed suite's ladder test that ran out of memory. Speeds of the first variants are not claims (lanes share the GPU).
set +e
export LOGS=/tmp/dl_run91
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
  R a_ut_2b 540 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut --model small --seq 4096 --mbs 2 --num-mb 2 --steps 17 --warmup 3 --profile-steps 0 --no-paired --no-control --variants eager_packed,eager_padded,ours_padded,eager_padded_repeat,ours_packed,ours_padded_megatron" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c2
  R b_moe_packed_det 150 "NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_moe_packed_det.json $PYT tests/gpu/test_packed_moe.py"
  R c_moe_packed 150 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_moe_packed.json $PYT tests/gpu/test_packed_moe.py" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c3
  R d_packed_ladder_det 150 "NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed_ladder_det.json $PYT tests/gpu/test_packed_language.py -k ladder_rungs_share" ) &
wait
grep -H " passed\| failed\| error" "$LOGS"/*.log | grep -v "PASSED\|FAILED" | cut -c1-200
grep -h "^FAILED\|^E  " "$LOGS"/[bcd]_*.log | cut -c1-300 | head -12
python3 - <<'PY'
import json, os
for f in ("gpu_moe_packed_det.json", "gpu_moe_packed.json"):
    p = os.path.join(os.environ["LOGS"], f)
    if os.path.exists(p):
        for r in json.load(open(p))["rows"]:
            if r.get("loss_exact") is False or "loss_tokens_differ" in r and r["loss_tokens_differ"]:
                print(f, {k: r.get(k) for k in ("case", "loss_max_abs", "loss_tokens_differ", "loss_tokens_differ_kept", "loss_worst_index", "loss_worst_mask", "loss_worst_values", "loss_tokens", "grad_exact_fraction")})
PY
sed -n '/^| variant/,/^$/p' "$LOGS/ut/useful_tokens.md" | cut -c1-330
table
