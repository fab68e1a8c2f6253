#!/usr/bin/env bash
# Device call of run 26 (2026-12-01, session 9): the useful-tokens benchmark on Bridge's Qwen3-VL 8B LoRA recipe
# (benchmarks/recipe_variants.py), every variant in one process, global batch 16 (8 micro-batches of 2: the recipe's
# 32 does not fit one 10-minute call with the padded variants), no paired phase (the variants are far apart).
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run26.sh
# Run 26 failed in every variant (LoRA adapters without groups under M4; LoRA state_dict keys); run 27 reran it.
set +e
export LOGS=${LOGS:-/tmp/dl_run26}
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v -i warn
source scripts/device_lib.sh
export PYTHONPATH=$PWD HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $LOGS/gpu.txt
python3 -c "import torch, transformer_engine, megatron.core, megatron.bridge as b; print(torch.__version__, transformer_engine.__version__, megatron.core.__version__, b.__version__)" > $LOGS/versions.txt 2>&1
R u1_peft8b ${BENCH_LIMIT:-540} "python3 -m benchmarks.useful_tokens --out \$LOGS/useful_tokens_peft8b --model peft8b --num-mb 8 --warmup 2 --steps ${STEPS:-3} --profile-steps 0 --no-paired"
table
tail -n 30 $LOGS/u1_peft8b.log
