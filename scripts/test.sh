#!/usr/bin/env bash
# The tests: set up (idempotent, see scripts/setup.sh), then `pytest -q`. Extra arguments go to pytest.
# Without CUDA the GPU tests are skipped with a reason; on a GPU machine they run too (`-m gpu` for only them).
# Exits non-zero when a test fails, and also when pytest collected no test at all (its exit code 5).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$(bash scripts/setup.sh | tail -n 1)"
# Neither the python nor the README's `bridge-cudagraph` is on PATH after set-up (the .venv is not activated): say both.
echo "test.sh: python $PY" >&2
if [ -x "$(dirname "$PY")/bridge-cudagraph" ]; then
  echo "test.sh: bridge-cudagraph is $(dirname "$PY")/bridge-cudagraph (source $(dirname "$PY")/activate puts it on PATH)" >&2
else
  echo "test.sh: bridge-cudagraph is \"$PY -m bridge_cudagraph\" here (from $ROOT)" >&2
fi
status=0
"$PY" -m pytest -q "$@" || status=$?
if [ "$status" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; treating that as a failure" >&2
  exit 1
fi
exit "$status"
