#!/usr/bin/env bash
# Device call of run 45 (2026-12-02, session 14, issue #18): the README's main command again (run 44's failed on the
# device image's missing qwen_vl_utils, which .whl/ did not carry that time), then the 2B shape the issue's targets
# are judged on (micro-batch 1, sequence 2048) with the forward's positions filled before the input embedding:
# eager, upstream, ours, ours_fused, ours_fused_host_waits (Bridge's forward as it is), the control, the paired phase
# upstream vs ours_fused and the lever pair ours_fused_host_waits vs ours_fused. One step at a time: the benchmark
# has the GPU and the host to itself.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run45.sh
set +e
export LOGS=/tmp/dl_run45
source scripts/device_lib.sh
prologue
R m1_run_sh 190 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29641 bash scripts/run.sh"
R b1_waits_2b 380 "python3 -m benchmarks.bench --out \$LOGS/bench_2b --configs small-mbs1-seq2048 --variants eager,upstream,ours,ours_fused,ours_fused_host_waits --paired-with ours_fused --lever-pairs ours_fused_host_waits:ours_fused"
python3 - <<'PY'
import json, os, statistics
path = os.path.join(os.environ["LOGS"], "bench_2b", "bench.json")
if os.path.exists(path):
    for c in json.load(open(path))["configs"]:
        for v, r in c["variants"].items():
            print(f"{v:24s} {r.get('status')} step {r.get('step_ms_median') or 0:8.2f} kern {r.get('kernel_ms_per_step') or 0:7.2f} busy {r.get('gpu_busy_in_profiled_steps') or 0:.2f} fixed {(r.get('fixed_batch') or {}).get('loss_max_abs_diff')} run {r.get('loss_max_abs_diff_vs_eager')}")
        for p in [c.get("paired") or {}, *(c.get("lever_pairs") or [])]:
            r = p.get("ratios") or []
            print("paired", p.get("variants"), p.get("status"), p.get("step_ms_median"), "median ratio", statistics.median(r) if r else None, p.get("error"))
PY
grep -n "Step time over kernel\|Paired\|longest GPU-idle\|vs the noise floor" "$LOGS"/bench_2b/bench.md | cut -c1-330
grep -n "useful tokens\|replays\|Traceback\|Error" "$LOGS"/m1_run_sh.log | tail -6 | cut -c1-250
table
