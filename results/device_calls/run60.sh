#!/usr/bin/env bash
# Device call of run 60 (2026-12-02): the main paths inside an 80 GB GPU's memory, emulated on the H200 with
# --gpu-memory 80 (torch's per-process memory fraction: an allocation past 80 GiB fails as on an H100).
# 1. The 2B shape, sequence 4096, micro-batch 2, 2 micro-batches a step, the photo data: Bridge's default
#    (eager_packed) and ours_packed, 30 measured steps each.
# 2. Bridge's 8B LoRA recipe on the photo data path (random base built first), graphs on, 30 iterations at global
#    batch 4 through `bridge-cudagraph train --gpu-memory 80`.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run60.sh
set +e
export LOGS=/tmp/dl_run60
source scripts/device_lib.sh
prologue
export BRIDGE_CUDAGRAPH_CACHE=/tmp/bcg_8b
sampled() {
  local name=$1; shift
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 1000 >"$LOGS/mem_$name.txt" 2>/dev/null &
  local sampler=$!
  R "$name" "$@"
  kill "$sampler" 2>/dev/null
}
sampled b1_2b_cap80 200 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_cap80 --model small --seq 4096 --mbs 2 --num-mb 2 --steps 30 --variants eager_packed,ours_packed --no-paired --no-control --profile-steps 0 --gpu-memory 80"
RECIPE=recipes/qwen3_vl_8b_peft_photos_graphs.yaml
sampled base 170 "python3 -m bridge_cudagraph.examples.random_base $RECIPE"
sampled lora_graphs_cap80 230 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29631 python3 -m bridge_cudagraph train $RECIPE train.train_iters=30 train.global_batch_size=4 validation.eval_iters=0 logger.log_interval=1 --gpu-memory 80"
for f in b1_2b_cap80 lora_graphs_cap80; do
  printf '%-18s peak GPU memory used (MiB, nvidia-smi each second): ' $f; sort -n "$LOGS/mem_$f.txt" | tail -n 1
done
grep -h "ours_packed\|eager_packed\|ladder\|peak reserved\|capped" "$LOGS/ut_cap80/useful_tokens.md" 2>/dev/null | cut -c1-300 | head -12
f=lora_graphs_cap80
printf 'lm loss: '; grep -o 'lm loss: [0-9.E+-]*' "$LOGS/$f.log" | awk '{printf "%s ", $3}'; echo
printf 'grad norm: '; grep -o 'grad norm: [0-9.E+-]*' "$LOGS/$f.log" | awk '{printf "%s ", $3}'; echo
grep -o 'mem-max-allocated-gigabytes: [0-9.]*' "$LOGS/$f.log" | tail -n 1
grep -E "^bridge_cudagraph|^  (language|vision|submodule|graph pools|memory|total)" "$LOGS/$f.log" | cut -c1-250 | tail -n 25
table
