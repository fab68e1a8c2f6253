#!/usr/bin/env bash
# Device call of run 20 (2026-12-01, session 7): the teardown test alone (ten Bridge jobs at once; its own limit for
# all runs is 500 s, so the step gets 560 s; run 19 gave it 330 s and timed out before pytest printed anything).
#   bash .devwheels/install.sh >/dev/null && bash results/device_calls/run20.sh
set +e
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v -i warn
source scripts/device_lib.sh
export PYTHONPATH=$PWD HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
git log -1 --format=%H > $LOGS/commit.txt 2>/dev/null
R t1_teardown 560 'BRIDGE_CUDAGRAPH_RESULTS=$LOGS/gpu_teardown.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_teardown.py'
table
