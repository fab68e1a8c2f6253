#!/usr/bin/env bash
# Device call of run 54 (2026-12-02, session 17, issue #18): Bridge's image-token merge without its host waits
# (bridge_cudagraph.forward_host.RowMerge, part of fewer_host_waits). First parity: the Bridge-reference suite under
# deterministic kernels (the row merge bit for bit Bridge's model, graphs off and language graphs replaying; the merge
# never waits in isolation; and the vision cases' shared context of 7fd5ea0 for the first time on a GPU). Then alone
# on the GPU, the 2B shape (micro-batch 1, sequence 2048): eager, upstream, ours_fused, ours_fused_merge_waits (the
# boolean merge as before), the control, the paired phase upstream vs ours_fused and the lever pair.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run54.sh
set +e
export LOGS=/tmp/dl_run54
source scripts/device_lib.sh
prologue
NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 R t1_reference 130 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_reference.json python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_bridge_reference.py"
grep -h " passed\| failed\| error" "$LOGS"/t*.log | grep -v "^PASSED\|^FAILED" | tail -3
grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/t*.log | cut -c1-300 | head -12
R b1_row_merge_2b 360 "python3 -m benchmarks.bench --out \$LOGS/bench_2b --configs small-mbs1-seq2048 --variants eager,upstream,ours_fused,ours_fused_merge_waits --paired-with ours_fused --lever-pairs ours_fused_merge_waits:ours_fused"
bench_summary bench_2b
table
