#!/usr/bin/env bash
# Device call of run 66 (2026-12-03): #35's last bullet, what MoE users get from graphs, each benchmark alone on the
# GPU, one after the other: the MoE tiny Qwen3-VL, then Qwen3-VL-30B-A3B's layer shape at 4 language layers (128
# experts, top 8, EP 1): Bridge's packed and padded eager steps against our padded graphs (attention, router,
# dispatch preprocess; vision graphs), then the eager control (the noise floor, run last).
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run66.sh
set +e
export LOGS=/tmp/dl_run66
source scripts/device_lib.sh
prologue
export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
R a_ut_moe_tiny 170 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_moe_tiny --model tiny-moe --warmup 2 --steps 8 --profile-steps 1"
R b_ut_moe_30b 360 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_moe_30b --model moe-30b-a3b-shape --microbatches 4 --warmup 2 --steps 6 --profile-steps 1"
for m in ut_moe_tiny ut_moe_30b; do grep -h "^| eager\|^| ours\|^| upstream\|noise\|refused" "$LOGS/$m/useful_tokens.md" 2>/dev/null | cut -c1-330 | head -14; done
table
