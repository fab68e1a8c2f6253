#!/usr/bin/env bash
# Device call of run 21 (2026-12-01, session 7): the teardown test's SIGTERM wave alone
# (BRIDGE_CUDAGRAPH_TEARDOWN_ENDINGS=signal: its checkpoint saves without the normal and exception runs' start-ups
# competing for the 16 cores). Run 20 ran all three waves together: normal 10/10, exception 10/10, signal 8/10.
#   bash .devwheels/install.sh >/dev/null && bash results/device_calls/run21.sh
set +e
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v -i warn
source scripts/device_lib.sh
export PYTHONPATH=$PWD HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
git log -1 --format=%H > $LOGS/commit.txt 2>/dev/null
R t2_teardown_signal 250 'BRIDGE_CUDAGRAPH_TEARDOWN_ENDINGS=signal BRIDGE_CUDAGRAPH_RESULTS=$LOGS/gpu_teardown_signal.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_teardown.py'
table
