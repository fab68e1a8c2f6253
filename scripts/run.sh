#!/usr/bin/env bash
# The main job, with its own idempotent set-up (scripts/setup.sh):
#   - on a machine with a CUDA GPU: fine-tune a small Qwen3-VL through Bridge's own Qwen3-VL SFT data path
#     (recipes/tiny_qwen3_vl_photos.yaml: DirectHFSFTDatasetConfig over real photographs that scikit-image ships,
#     a Qwen3-VL processor folder built offline, in-batch packing in Bridge's Qwen3-VL step), packed, with language
#     and vision graphs; it prints the capture summary and the useful tokens/s (tokens with loss per second);
#     extra arguments are key=value overrides of that recipe;
#   - without a GPU: print what that same recipe would capture (layouts, packed budgets, vision budgets, static
#     shapes), which needs no GPU and no download.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$(bash scripts/setup.sh | tail -n 1)"
# Neither the python nor the README's `bridge-cudagraph` is on PATH after set-up (the .venv is not activated): say both.
echo "run.sh: python $PY" >&2
if [ -x "$(dirname "$PY")/bridge-cudagraph" ]; then
  echo "run.sh: bridge-cudagraph is $(dirname "$PY")/bridge-cudagraph (source $(dirname "$PY")/activate puts it on PATH)" >&2
else
  echo "run.sh: bridge-cudagraph is \"$PY -m bridge_cudagraph\" here (from $ROOT)" >&2
fi
export HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  exec "$PY" -m bridge_cudagraph train recipes/tiny_qwen3_vl_photos.yaml "$@"
fi
echo "run.sh: no CUDA GPU here, so instead of training: the plan of the same recipe (recipes/tiny_qwen3_vl_photos.yaml)" >&2
exec "$PY" -m bridge_cudagraph plan recipes/tiny_qwen3_vl_photos.yaml "$@"
