#!/usr/bin/env bash
# The benchmark's full matrix (tiny + small-mbs{1,2}-seq{2048,4096}) in one call on a machine with two GPUs:
# one child process per GPU, each running all variants of its configurations side by side (see the module
# docstring of benchmarks/bench.py), merged into OUT/bench.{json,md,png}; each child's own output and log
# are in OUT/part<i>-gpu<id>/.
#
#   bash scripts/bench_two_gpus.sh [OUT] [more bench flags...]     # OUT defaults to results/bench
#
# Each child is stopped after $BENCH_TIME_LIMIT seconds (default 500: a 10-minute device call leaves room for
# start-up, the merge and an install step before it); what it finished is kept and the rest is marked failed.
# A later --time-limit among the extra flags wins. Python: $PYTHON, default python3 (the stack's interpreter).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m benchmarks.bench --out "${1:-results/bench}" --gpus 2 \
  --time-limit "${BENCH_TIME_LIMIT:-500}" "${@:2}"
