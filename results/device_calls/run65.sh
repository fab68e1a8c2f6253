#!/usr/bin/env bash
# Device call of run 65 (2026-12-03): the GPU suites at the final commit of the last session (the finalize ChainLink)
# and #35's open checks, lanes sharing one H200 (no speed figure is taken from this call):
# (A) the vision padding test with the MoE photo run's 4096-budget micro-batches (run 64 parted at the fourth), then
#     the MoE tiny Qwen3-VL's Bridge loop under NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 (language-only exactness, the
#     strict xfails of the vision graphs);
# (B) the dense Bridge loop (host patches, finalize chain);
# (C) the optimizer host step and the fault suite;
# (D) the padded benchmark with upstream's full-iteration graph as a variant: does it capture, replay, match.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run65.sh
set +e
export LOGS=/tmp/dl_run65
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1 NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
  R a1_vision_padding_det 150 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_vision_padding_det.json $PYT tests/gpu/test_vision_padding.py"
  R a2_moe_det 420 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_loop_moe_det.json $PYT tests/gpu/test_bridge_loop.py -k moe" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c2
  R b_bridge_loop 450 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_loop.json $PYT tests/gpu/test_bridge_loop.py -k 'not moe'" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c3
  R c_host_faults 300 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_host_faults.json $PYT tests/gpu/test_optimizer_host_step.py tests/gpu/test_faults.py" ) &
( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c4
  R d_bench_full_iteration 420 "python3 -m benchmarks.bench --out \$LOGS/bench_fi --configs tiny --variants eager,upstream,ours,upstream_full_iteration --no-paired" ) &
wait
grep -H " passed\| failed\| error" "$LOGS"/*.log | grep -v "PASSED\|FAILED" | cut -c1-200
grep -h "^FAILED\|^ERROR\|^E  \|XPASS\|XFAIL" "$LOGS"/*.log | cut -c1-300 | head -30
python3 - "$LOGS/gpu_vision_padding_det.json" <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except Exception as error:
    sys.exit(print("no rows:", error))
for r in rows:
    print({k: r.get(k) for k in ("case", "patches", "budget", "padded_equal_eager_loss", "padded_vs_eager_grads_differing", "padded_vs_eager_grad_max_rel_l2", "padding_changes_the_numbers")})
PY
bench_summary bench_fi
table
