#!/usr/bin/env bash
# Device call of run 23b (2026-12-01 13:16-13:19 UTC, session 8), sent inline right after run 23 on the same warm
# machine (its base checkpoint and run 23's logs still in /tmp): the 8B LoRA recipe's eager run a second time, for
# the eager-vs-eager floor, then both of run 23's runs compared with it. Logs: results/run23/eager_again/.
bash .devwheels/install.sh >/dev/null 2>&1; export LOGS=/tmp/dl24; bash scripts/lora8b_smoke.sh 4 30 eager 2>&1 | tail -12; python3 -m benchmarks.loop_logs --out $LOGS/lora8b_floor.json --reference /tmp/device_logs/eager.log $LOGS/eager.log /tmp/device_logs/graphs.log 2>&1 | tail -3; mkdir -p $LOGS/run23_on_machine; cp /tmp/device_logs/* $LOGS/run23_on_machine/; source scripts/device_lib.sh; pack
