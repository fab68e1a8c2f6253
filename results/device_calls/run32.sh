#!/usr/bin/env bash
# Device call of run 32 (2026-12-01, session 10, issue #18): the levers side by side. First the GPU checks: the
# vision suite on the new default (graphs cut after each deepstack layer), the optimizer-graph test
# (deterministic), and Bridge's pretrain() with the optimizer graph composed with ours (recipes/tiny_gpt_packed.yaml,
# 30 iterations, deterministic: ours + optimizer graph vs graphs off + optimizer graph, twice, and vs Bridge's
# default optimizer). Then the benchmark's lever run on the 2B shape alone on the GPU: eager, upstream, ours,
# ours_per_layer, ours_optgraph, the eager control, and the paired phase of upstream and ours.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run32.sh
set +e
export LOGS=/tmp/dl_run32
source scripts/device_lib.sh
prologue
DET=NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=5'
GPT='python3 -m bridge_cudagraph train recipes/tiny_gpt_packed.yaml train.train_iters=30'
OPT=optimizer.optimizer_cuda_graph=true
OFF=model.cuda_graph.language.enabled=false
LEVERS=eager,upstream,ours,ours_per_layer,ours_optgraph
( R t1_vision 200 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_vision.json $PYT tests/gpu/test_vision_capture.py"
  R t2_optimizer_graph_det 120 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_optimizer_graph_det.json $PYT tests/gpu/test_optimizer_graph.py" ) &
( R o1_gpt_ours_opt 100 "BRIDGE_CUDAGRAPH_CACHE=/tmp/c1 $DET MASTER_ADDR=127.0.0.1 MASTER_PORT=29631 $GPT $OPT"
  R o2_gpt_off_opt 100 "BRIDGE_CUDAGRAPH_CACHE=/tmp/c2 $DET MASTER_ADDR=127.0.0.1 MASTER_PORT=29632 $GPT $OFF $OPT"
  R o3_gpt_off_opt_again 100 "BRIDGE_CUDAGRAPH_CACHE=/tmp/c3 $DET MASTER_ADDR=127.0.0.1 MASTER_PORT=29633 $GPT $OFF $OPT"
  R o4_gpt_off_default 100 "BRIDGE_CUDAGRAPH_CACHE=/tmp/c4 $DET MASTER_ADDR=127.0.0.1 MASTER_PORT=29634 $GPT $OFF"
  R o5_compare 20 "python3 -m benchmarks.loop_logs --out \$LOGS/gpt_optimizer_graph_loop.json --reference \$LOGS/o2_gpt_off_opt.log --floor \$LOGS/o3_gpt_off_opt_again.log \$LOGS/o1_gpt_ours_opt.log"
  R o6_vs_default 20 "python3 -m benchmarks.loop_logs --out \$LOGS/gpt_optimizer_graph_vs_default.json --reference \$LOGS/o4_gpt_off_default.log \$LOGS/o1_gpt_ours_opt.log \$LOGS/o2_gpt_off_opt.log" ) &
wait
R b1_levers_2b 420 "python3 -m benchmarks.bench --out \$LOGS/bench_2b --configs small-mbs1-seq2048 --variants $LEVERS"
for f in o1_gpt_ours_opt o2_gpt_off_opt o3_gpt_off_opt_again o4_gpt_off_default; do
  printf '%-22s ' $f; grep -o 'lm loss: [0-9.E+-]*' $LOGS/$f.log | awk '{printf "%s ", $3}' | cut -c1-150; echo
done
python3 - <<'PY'
import json, os
path = os.path.join(os.environ["LOGS"], "bench_2b", "bench.json")
if os.path.exists(path):
    for c in json.load(open(path))["configs"]:
        for v, r in c["variants"].items():
            print(f"{v:16s} {r.get('status')} step {r.get('step_ms_median') or 0:8.2f} kern {r.get('kernel_ms_per_step') or 0:7.2f} busy {r.get('gpu_busy_in_profiled_steps') or 0:.2f} mfu {r.get('mfu') or 0:.3f} fixed {(r.get('fixed_batch') or {}).get('loss_max_abs_diff')}")
        p = c.get("paired") or {}
        print("paired", p.get("status"), p.get("step_ms_median"), p.get("reason") or p.get("error"))
PY
table
