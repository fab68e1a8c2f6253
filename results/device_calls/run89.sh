#!/usr/bin/env bash
# Device call of run 89 (2026-12-05), sized to the device time left: #46's 2B proof, the useful-tokens benchmark at the
# 2B shape (sequence 4096, micro-batch 2, 2 micro-batches, 17 steps, no profile, no pairs): the padded ladder
# (ours_padded) against eager_padded, every parameter's gradient against the eager-vs-eager floor (eager_padded_repeat),
# eager_packed as the harness's baseline (ours_packed and ours_padded_megatron left out for time). Beside it (so no
# speed claim from this call): #50's module path of a train call, the corrected 4096-patch Bridge-reference case under
# deterministic kernels, and the packed MoE suite of branch moe-packed without them. Run 88 failed in the benchmark's
# own prepare and in module_path's iteration count (both fixed in abfa1f2).
#   bash .devwheels/install.sh >/dev/null 2>&1; bash .snap/run89.sh
set +e
export LOGS=/tmp/dl_run89
source scripts/device_lib.sh
prologue
export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c2
  R a_module_path 80 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29661 python3 -m benchmarks.module_path recipes/tiny_qwen3_vl_photos.yaml --out \$LOGS/module_path train.train_iters=6"
  R c_reference_4096_det 150 "NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_reference_4096_det.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_bridge_reference.py -k 4096"
  mkdir -p /tmp/moe && tar -xzf .snap/moe-packed.tgz -C /tmp/moe
  R d_moe_packed 120 "cd /tmp/moe && BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_moe_packed.json PYTHONPATH=/tmp/moe python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_packed_moe.py" ) &
LANE_B=$!
R b_ut_2b 320 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut --model small --seq 4096 --mbs 2 --num-mb 2 --steps 17 --warmup 3 --profile-steps 0 --no-paired --no-control --variants eager_packed,eager_padded,ours_padded,eager_padded_repeat"
for _ in $(seq 15); do kill -0 $LANE_B 2>/dev/null || break; sleep 1; done
pack
grep -H " passed\| failed" "$LOGS"/c_*.log "$LOGS"/d_*.log | cut -c1-200
grep -h "^E  " "$LOGS"/c_*.log "$LOGS"/d_*.log | cut -c1-300 | head -8
grep -h "replayed" "$LOGS/a_module_path.log" | tail -1 | cut -c1-300
sed -n '/^| variant/,/^$/p' "$LOGS/ut/useful_tokens.md" 2>/dev/null | cut -c1-330
table 2>&1 | head -20
