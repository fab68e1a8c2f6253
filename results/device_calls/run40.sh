#!/usr/bin/env bash
# Device call of run 40 (2026-12-01, session 13, issue #18): model.gradient_accumulation_fusion=true without APEX
# (bridge_cudagraph.wgrad_fusion: the host builds unfused, then the language model's TE layers sum their weight
# gradients into main_grad in their GEMMs). First the GPU checks side by side (tiny models): under TE's deterministic
# kernels, language graphs with the fusion bit for bit against Bridge's unmodified provider with TE's fusion on in the
# same modules; Bridge's loop (now seven runs: two more with the fusion, graphs on and off, losses identical). Then the
# benchmark alone on the GPU, 2B shape, micro-batch 1, sequence 2048: eager, upstream, ours, ours_fused, the paired
# phase upstream vs ours_fused and the lever pair ours vs ours_fused; no control (run 39 measured the floor).
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run40.sh
set +e
export LOGS=/tmp/dl_run40
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=5'
( R t1_reference_fused 150 "NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_reference_fused.json $PYT tests/gpu/test_bridge_reference.py -k fused" ) &
( R t2_bridge_loop 300 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_loop.json $PYT tests/gpu/test_bridge_loop.py" ) &
wait
R b1_fused_2b 270 "python3 -m benchmarks.bench --out \$LOGS/bench_2b --configs small-mbs1-seq2048 --no-control --variants eager,upstream,ours,ours_fused --paired-with ours_fused --lever-pairs ours:ours_fused"
python3 - <<'PY'
import json, os, statistics
path = os.path.join(os.environ["LOGS"], "bench_2b", "bench.json")
if os.path.exists(path):
    for c in json.load(open(path))["configs"]:
        for v, r in c["variants"].items():
            print(f"{v:24s} {r.get('status')} step {r.get('step_ms_median') or 0:8.2f} kern {r.get('kernel_ms_per_step') or 0:7.2f} busy {r.get('gpu_busy_in_profiled_steps') or 0:.2f} fixed {(r.get('fixed_batch') or {}).get('loss_max_abs_diff')} run {r.get('loss_max_abs_diff_vs_eager')}")
        for p in [c.get("paired") or {}, *(c.get("lever_pairs") or [])]:
            r = p.get("ratios") or []
            print("paired", p.get("variants"), p.get("status"), p.get("step_ms_median"), "median ratio", statistics.median(r) if r else None, p.get("ci95"), p.get("error"))
PY
cp "$LOGS"/bench_2b/bench.md "$OUT"/ 2>/dev/null
table
