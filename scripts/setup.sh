#!/usr/bin/env bash
# Idempotent environment set-up for bridge_cudagraph. Prints the python to use on its last line.
#
# 1. A machine that already has the Megatron stack (an NGC PyTorch/NeMo container: torch, TE,
#    megatron-core, megatron-bridge importable from `python3`) is used as it is: nothing is installed
#    over it; only the plugin itself goes on PYTHONPATH.
# 2. Otherwise a virtual environment `.venv` on Python 3.12 gets the pinned stack of
#    requirements-cpu.txt, with megatron-core / megatron-bridge installed --no-deps (see that file).
#    TE's torch extension is taken from ../shared/wheels when present (else it builds, ~12 min).
# A stamp file keyed on the requirement files makes a second run a no-op.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MCORE=megatron-core==0.19.2
MBRIDGE=megatron-bridge==0.6.2
probe='import torch, transformer_engine.pytorch, megatron.core, megatron.bridge'

have_stack() { "$1" -c "$probe" >/dev/null 2>&1; }

# Case 1: the host already has the stack (NGC container). Use it, do not build a parallel one.
if [ -z "${BRIDGE_CUDAGRAPH_FORCE_VENV:-}" ] && [ ! -d .venv ] && command -v python3 >/dev/null \
    && have_stack python3; then
  python3 -c 'import pytest' 2>/dev/null || python3 -m pip install -q pytest >&2
  echo "$(command -v python3)"
  exit 0
fi

VPY="$ROOT/.venv/bin/python"
STAMP="$ROOT/.venv/.setup-$(cat requirements-cpu.txt scripts/setup.sh | sha1sum | cut -c1-12)"
if [ -x "$VPY" ] && [ -f "$STAMP" ]; then
  echo "$VPY"
  exit 0
fi

find_py312() {
  for c in "${PYTHON312:-}" "$(command -v pyenv >/dev/null && echo "$(pyenv root)/versions/3.12.1/bin/python3.12")" \
           "$(command -v python3.12 || true)" "$(command -v python3 || true)"; do
    [ -n "$c" ] && [ -x "$c" ] && "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null \
      && { echo "$c"; return; }
  done
  echo "no Python 3.12 found (megatron-bridge needs >=3.12,<3.13); set PYTHON312=/path/to/python3.12" >&2
  exit 1
}

if [ ! -x "$VPY" ]; then
  "$(find_py312)" -m venv "$ROOT/.venv" >&2
fi
PIP=("$VPY" -m pip install -q --disable-pip-version-check)
WHEELS="$ROOT/../shared/wheels"
[ -d "$WHEELS" ] && PIP+=(--find-links "$WHEELS")
echo "setup: installing the pinned stack into .venv (first run only, ~6 min)" >&2
"${PIP[@]}" --upgrade pip setuptools wheel >&2
"${PIP[@]}" -r requirements-cpu.txt >&2
"${PIP[@]}" --no-deps "$MCORE" "$MBRIDGE" >&2
"${PIP[@]}" --no-deps --no-build-isolation -e "$ROOT" >&2
have_stack "$VPY" || { echo "setup: the stack does not import; see the log above" >&2; exit 1; }
rm -f "$ROOT"/.venv/.setup-*
touch "$STAMP"
echo "$VPY"
