#!/usr/bin/env bash
# Device call of run 25 (2026-12-01 13:26-13:34 UTC, session 8), sent inline right after run 24 on the same warm
# machine: the teardown test's three waves (normal, exception, SIGTERM; ten runs each) with the runner that imports
# the training stack inside main(), every run's JSON and log kept (results/run25/teardown.tar.gz: the folder packed, its files unchanged), then the spawn probe
# (which timed out at 70 s, printing nothing: the probe prints after all its repeats).
bash .devwheels/install.sh >/dev/null 2>&1; export LOGS=/tmp/dl_run25; source scripts/device_lib.sh; export PYTHONPATH=$PWD HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1; R t1_teardown 420 'BRIDGE_CUDAGRAPH_LOGS=$LOGS BRIDGE_CUDAGRAPH_RESULTS=$LOGS/gpu_teardown.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_teardown.py'; R p2_spawn_probe 70 'python3 -m benchmarks.spawn_manager_probe --repeats 2'; grep -h '"save_s"\|save_s\|sigkilled' $LOGS/gpu_teardown.json | cut -c1-300 | head; table
