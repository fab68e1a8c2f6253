#!/usr/bin/env bash
# The main job, with its own idempotent set-up (scripts/setup.sh):
#   - on a machine with a CUDA GPU: train the tiny self-contained Qwen3-VL recipe with language and vision
#     graphs (recipes/tiny_qwen3_vl.yaml; random weights, synthetic images, about a minute on one GPU);
#     extra arguments are key=value overrides of that recipe;
#   - without a GPU: print what the bundled Qwen3-VL 8B recipe would capture on 8 GPUs (layouts, graphs,
#     static shapes, vision budgets), which needs no GPU and no download.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$(bash scripts/setup.sh | tail -n 1)"
if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  exec "$PY" -m bridge_cudagraph train recipes/tiny_qwen3_vl.yaml "$@"
fi
echo "run.sh: no CUDA GPU here, so instead of training: the plan of the Qwen3-VL 8B recipe on 8 GPUs" >&2
exec "$PY" -m bridge_cudagraph plan recipes/qwen3_vl_8b_sft_graphs.yaml --world-size 8
