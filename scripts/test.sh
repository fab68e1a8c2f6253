#!/usr/bin/env bash
# The tests: set up (idempotent, see scripts/setup.sh), then `pytest -q`. Extra arguments go to pytest.
# Without CUDA the GPU tests are skipped with a reason; on a GPU machine they run too (`-m gpu` for only them).
# Exits non-zero when a test fails, and also when pytest collected no test at all (its exit code 5).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$(bash scripts/setup.sh | tail -n 1)"
status=0
"$PY" -m pytest -q "$@" || status=$?
if [ "$status" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; treating that as a failure" >&2
  exit 1
fi
exit "$status"
