#!/usr/bin/env bash
# Device call of run 37 (2026-12-01, session 12, issue #18). First the GPU checks left unrun by session 11, side by
# side (tiny models): the vision graph suite (its host-sync test failed in run 36 on pageable uploads of new image
# sizes; the uploads now go from pinned memory) and the two optimizer tests after their shared-helper refactor
# (tests/gpu/_optimizer_runs.py). Then a diagnostic benchmark alone on the GPU, 2B shape, eager and ours only, with
# --profile-stacks: ours' GPU-idle time attributed to the Python functions the host was in (a profile with stacks
# runs slower on the host, so its busy figure is a lower bound; no paired phase). The trace comes back as a file.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run37.sh
set +e
export LOGS=/tmp/dl_run37
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=5'
( R t1_vision 240 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_vision.json $PYT tests/gpu/test_vision_capture.py" ) &
( R t2_optimizer 240 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_optimizer.json $PYT tests/gpu/test_optimizer_host_step.py tests/gpu/test_optimizer_graph.py" ) &
wait
R b1_stacks_2b 300 "python3 -m benchmarks.bench --out \$LOGS/diag_2b --configs small-mbs1-seq2048 --no-control --no-paired --variants eager,ours --profile-stacks; mv \$LOGS/diag_2b/trace_*.json.gz \$OUT/ 2>/dev/null; ls -la \$OUT"
python3 - <<'PY'
import json, os
path = os.path.join(os.environ["LOGS"], "diag_2b", "bench.json")
if os.path.exists(path):
    for c in json.load(open(path))["configs"]:
        for v, r in c["variants"].items():
            print(f"{v:10s} {r.get('status')} step {r.get('step_ms_median') or 0:8.2f} kern {r.get('kernel_ms_per_step') or 0:7.2f} busy {r.get('gpu_busy_in_profiled_steps') or 0:.2f} fixed {(r.get('fixed_batch') or {}).get('loss_max_abs_diff')}")
        py = ((c["variants"].get("ours") or {}).get("host_time") or {}).get("python") or {}
        for key in ("self", "inclusive"):
            for row in (py.get(key) or [])[:12]:
                print(key[:4], row["thread"][:5], f"{row['idle_ms_per_step']:6.2f}", row["name"][:100])
PY
grep -E "passed|failed|error" $LOGS/t*.log | tail -8
table
