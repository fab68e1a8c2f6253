#!/usr/bin/env bash
# Issue #17 (2, last bullet): Bridge's Qwen3-VL 8B LoRA recipe (qwen3_vl_8b_peft_1gpu_h100_bf16_config) on one H200 at
# the real shape, random weights, offline, through the photo recipe's data path: graphed, then eager, in one device call.
# From the repository root on the device machine, with .devwheels and .whl carried (../shared/device/README.md):
#   bash .devwheels/install.sh >/dev/null && bash scripts/lora8b_smoke.sh [GLOBAL_BATCH [ITERATIONS [RUNS]]]
# RUNS: "graphs eager" (default), or one of them; LIMIT_BASE, LIMIT_GRAPHS, LIMIT_EAGER (seconds) override the
# steps' timeouts, e.g. the recipe's global batch 32 in two calls:
#   LIMIT_GRAPHS=390 bash scripts/lora8b_smoke.sh 32 30 graphs   and   LIMIT_EAGER=390 bash scripts/lora8b_smoke.sh 32 30 eager
# Default: global batch 4 (2 micro-batches of 2 per step), 30 iterations, so that the base checkpoint and both runs end
# inside one call's 10 minutes. The recipe's global batch 32 is 16 micro-batches a step; estimated (not measured) 2-3 s a
# graphed step and 7-8 s an eager one (~0.1 s of kernels per micro-batch, eager host-bound at ~0.45 s as the 2B shape
# was), so 30 of each plus ~1 min of set-up per process, the capture and the base (~1.5-3 min) overrun one call.
# Estimated budget at the default: base 1.5-3 min, graphed 3-3.5 min, eager 2.5 min.
# Steps, each under its own timeout, logs in $LOGS and packed into $OUT/all.tgz (scripts/device_lib.sh):
#   base    the random base checkpoint, ~17.5 GB under $BRIDGE_CUDAGRAPH_CACHE (bridge_cudagraph/examples/random_base.py)
#   graphs  `train` with packed language graphs and vision graphs (the recipe as it is)
#   eager   the same with both graph switches off: Bridge's own eager packed step
# Then the per-iteration losses of both runs, the capture summary, memory, and each step's exit code and seconds.
set +e
GBS=${1:-4}
ITERS=${2:-30}
RUNS=${3:-graphs eager}
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v -i warn
source scripts/device_lib.sh
export PYTHONPATH=$PWD HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 BRIDGE_CUDAGRAPH_CACHE=${BRIDGE_CUDAGRAPH_CACHE:-/tmp/bcg_8b}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$LOGS/gpu.txt"
df -h /tmp > "$LOGS/disk.txt" 2>&1
RECIPE=recipes/qwen3_vl_8b_peft_photos_graphs.yaml
# No evaluation (Bridge's recipe evaluates 32 global batches on the validation and the test split after training), a
# loss line per iteration (the recipe logs every 10).
RUN="train.train_iters=$ITERS train.global_batch_size=$GBS validation.eval_iters=0 logger.log_interval=1"
OFF='model.cuda_graph.language.enabled=false model.cuda_graph.vision.enabled=false'
# GPU memory in use, sampled every second while a step runs (its peak is printed at the end).
sampled() {
  local name=$1; shift
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 1000 >"$LOGS/mem_$name.txt" 2>/dev/null &
  local sampler=$!
  R "$name" "$@"
  kill "$sampler" 2>/dev/null
}
sampled base "${LIMIT_BASE:-190}" "python3 -m bridge_cudagraph.examples.random_base $RECIPE"
case " $RUNS " in *" graphs "*)
  sampled graphs "${LIMIT_GRAPHS:-225}" \
    "MASTER_ADDR=127.0.0.1 MASTER_PORT=29621 python3 -m bridge_cudagraph train $RECIPE $RUN";;
esac
case " $RUNS " in *" eager "*)
  sampled eager "${LIMIT_EAGER:-150}" \
    "MASTER_ADDR=127.0.0.1 MASTER_PORT=29622 python3 -m bridge_cudagraph train $RECIPE $RUN $OFF";;
esac
for f in base $RUNS; do
  printf '%-7s peak GPU memory used (MiB, nvidia-smi each second): ' $f; sort -n "$LOGS/mem_$f.txt" | tail -n 1
done
for f in $RUNS; do
  printf '%-7s lm loss: ' $f; grep -o 'lm loss: [0-9.E+-]*' "$LOGS/$f.log" | awk '{printf "%s ", $3}'; echo
  # The adapters start at zero (LoRA B) and the learning rate warms up over 500 iterations, so the loss barely moves in
  # 30: the gradient norm (of the adapters alone) is what shows that the graphs hand back the adapters' gradients.
  printf '%-7s grad norm: ' $f; grep -o 'grad norm: [0-9.E+-]*' "$LOGS/$f.log" | awk '{printf "%s ", $3}'; echo
  printf '%-7s ms/iter: ' $f
  grep -o 'elapsed time per iteration (ms): [0-9.]*' "$LOGS/$f.log" | awk '{printf "%s ", $6}'; echo
  grep -o 'mem-max-allocated-gigabytes: [0-9.]*' "$LOGS/$f.log" | tail -n 1 | sed "s/^/$f /"
  grep -E '^bridge_cudagraph: useful tokens' "$LOGS/$f.log" | tail -n 1 | cut -c1-200
  grep -E '^bridge_cudagraph: .*finished' "$LOGS/$f.log" | sed "s/^/$f /"
done
if [ -f "$LOGS/graphs.log" ]; then
  echo '== capture summary (graphs)'
  grep -A3 'CUDA graph capture before step' "$LOGS/graphs.log" | cut -c1-200
  grep -E '^bridge_cudagraph \[iteration' "$LOGS/graphs.log" | tail -n 1 | cut -c1-240
fi
grep -h 'random_base:' "$LOGS/base.log" | cut -c1-200
table
