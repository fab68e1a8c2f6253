#!/usr/bin/env bash
# Draft of the next session's device calls (not yet run). Runs 94-97 (2026-12-05, eighth session, H100s) measured
# packed MoE graphs (tiny paired, 30B-A3B shape on the 80 GB card), #46's 2B padded set on the 80 GB card, and traced
# the 14.6 GiB outside PyTorch's allocator to the test world binding its default group (NCCL communicators of every
# group created up front). The test world is unbound since f5683ed, which every GPU suite uses: rerun them all.
# What is left, in the order that decides the most:
#   S  every one-GPU suite at the final commit (results/device_calls/run90.sh case S: seven lanes; keep the 2B
#      benchmark out of it, it starved the others in run 90), teardown among them (B)
#   E  the eager-shape question of runs 91-93 (eager_shapes_draft.py in three fresh processes, about 3 min) beside
#      teardown and #50's module path (B's lanes)
# Copy this and eager_shapes_draft.py to .snap/ and keep results/ out of the call (the staged stack and the tree are
# over the call's 64 MiB with it): `git rm -r --cached -q results; echo /results/ >> .git/info/exclude`, undone after
# the call with `git reset -q -- results` and that line removed. Wrap the call in `timeout 575` and copy $LOGS to $OUT
# after it, so a call its own limit ends still brings its logs back. Then
#   bash .devwheels/install.sh >/dev/null 2>&1; timeout 575 bash .snap/next_draft.sh E; cp -r /tmp/dl_next_E $OUT/
set +e
export LOGS=/tmp/dl_next_$1
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
case "$1" in
B|E)  # Teardown with fewer lanes beside it (it timed out at 400 s under six in run 87; not run since), #50's module
    # path (now through sys.monitoring), and (E) the eager-shape question: the graphs-off MoE model's loss of the
    # first token count, as is, with static shapes only, and without the compiled cross entropy.
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c4
      for mode in as_is static_shapes no_ce_fusion; do
        R "e_shapes_$mode" 120 "python3 .snap/eager_shapes_draft.py $mode"
      done ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
      R b_teardown 480 "BRIDGE_CUDAGRAPH_LOGS=\$LOGS/teardown BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_teardown.json $PYT tests/gpu/test_teardown.py" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c3
      R m_module_path 240 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29681 python3 -m benchmarks.module_path recipes/tiny_qwen3_vl_photos.yaml --out \$LOGS/module_path train.train_iters=6" ) &
    wait
    grep -H " passed\| failed\| error" "$LOGS"/*.log | grep -v "PASSED\|FAILED" | cut -c1-200
    tail -n 1 "$LOGS"/e_shapes_*.log
    cat "$LOGS/module_path/module_path.json" | head -12 ;;
esac
table
