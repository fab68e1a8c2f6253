#!/usr/bin/env bash
# Device call of run 23 (2026-12-01, session 8): issue #17's 8B LoRA recipe again, after run 22 stopped at model construction (gradient_accumulation_fusion without APEX; the recipe now sets it off): the random base
# checkpoint, 30 graphed and 30 eager iterations at global batch 4 (scripts/lora8b_smoke.sh's default), then the
# two runs' per-iteration losses and grad norms compared NaN-safe (benchmarks.loop_logs).
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run22.sh
set +e
git log -1 --format=%H > /tmp/device_logs_commit.txt 2>/dev/null
bash scripts/lora8b_smoke.sh 4 30 "graphs eager"
source scripts/device_lib.sh
python3 -m benchmarks.loop_logs --out $LOGS/lora8b_loop.json --reference $LOGS/eager.log $LOGS/graphs.log > $LOGS/lora8b_compare.txt 2>&1
tail -c 1500 $LOGS/lora8b_compare.txt
pack
