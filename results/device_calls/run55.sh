#!/usr/bin/env bash
# Device call of run 55 (2026-12-02, session 17, issue #18): the row merge (forward_host.RowMerge) in the packed and
# Bridge-loop suites, two lanes at once: the packed graphs under deterministic kernels (exact against the plugin's
# eager model and Bridge's provider, the merge by rows counted) and Bridge's pretrain() loop (every graphed run takes
# the row merge, losses identical to graphs off). Then alone on the GPU, "no configuration slower than before" at
# micro-batch 1 / sequence 4096, not measured since run 39 (run 53 was cut): eager, upstream, ours_fused and their
# paired phase, no control. (Micro-batch 2 / sequence 2048 was measured just before the row merge, run 52.)
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run55.sh
set +e
export LOGS=/tmp/dl_run55
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=5'
( NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 R t1_packed_det 200 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed_det.json $PYT tests/gpu/test_packed_language.py" ) &
( R t2_bridge_loop 260 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_loop.json $PYT tests/gpu/test_bridge_loop.py tests/unit/test_host_patches.py" ) &
wait
grep -h " passed\| failed\| error" "$LOGS"/t*.log | grep -v "^PASSED\|^FAILED" | tail -4
grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/t*.log | cut -c1-300 | head -12
R b1_seq4096_2b 290 "python3 -m benchmarks.bench --out \$LOGS/bench_2b --configs small-mbs1-seq4096 --variants eager,upstream,ours_fused --paired-with ours_fused --no-control"
bench_summary bench_2b
table
