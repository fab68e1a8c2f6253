#!/usr/bin/env bash
# Device call of run 64 (2026-12-03), the session's last device time (~8 minutes):
# (A) where the MoE graphs leave eager's numbers under deterministic mode (run 63: eager repeats itself bit for bit,
#     graphs on differs by up to 1.9e-3 in loss): the MoE tiny recipe 14 iterations, no evaluation, Bridge's
#     deterministic mode, six runs at once: off, off again, and graphs on over [attn], [attn, moe_router],
#     [attn, moe_router, moe_preprocess] without vision graphs, and the recipe's own scope; each against off;
# (B) what MoE users get from graphs (#35): useful tokens of the MoE tiny and of the Qwen3-VL-30B-A3B layer shape
#     at 4 layers, EP 1, alone on the GPU after (A).
#   bash .devwheels/install.sh >/dev/null 2>&1; bash results/device_calls/run64.sh
set +e
export LOGS=/tmp/dl_run64
source scripts/device_lib.sh
prologue
export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
RUN="python3 -m torch.distributed.run --standalone --nproc_per_node 1 tests/gpu/_bridge_runner.py --recipe recipes/tiny_qwen3_vl_moe_photos.yaml --iters 14 --no-eval --override model.deterministic_mode=true --override model.cross_entropy_loss_fusion=false"
DETENV="NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 NCCL_ALGO=Ring CUBLAS_WORKSPACE_CONFIG=:4096:8"
moe() { local name=$1; shift; R "a_$name" 150 "$DETENV $RUN --out \$LOGS/moe_$name.json $*"; }
python3 -c "from bridge_cudagraph.examples.photo_recipe import tiny_qwen3_vl_moe_photos_config as f; f()" >"$LOGS/cache.log" 2>&1
( moe off --graphs off ) & ( moe off_again --graphs off ) &
( moe attn --graphs on "--override 'model.cuda_graph.language.modules=[attn]'" ) &
( moe router --graphs on "--override 'model.cuda_graph.language.modules=[attn,moe_router]'" ) &
( moe full_novision --graphs on --override model.cuda_graph.vision.enabled=false ) &
( moe full --graphs on ) &
wait
python3 - "$LOGS" <<'PY'
import json, math, sys
d = sys.argv[1]
def load(n):
    try:
        return json.load(open(f"{d}/moe_{n}.json"))
    except Exception as e:
        return {"error": str(e)}
ref = load("off")
rs = {s["iteration"]: s for s in ref.get("steps", [])}
for n in ("off_again", "attn", "router", "full_novision", "full"):
    r = load(n)
    st = {s["iteration"]: s for s in r.get("steps", [])}
    cap = {k: (v or {}).get("captured_at") for k, v in (r.get("capture") or {}).items()}
    row = [n, f"steps {len(st)}", f"captured_at {cap}"]
    for key in ("loss", "grad_norm"):
        diffs = {i: abs(st[i][key] - rs[i][key]) for i in st if i in rs and st[i][key] is not None and rs[i][key] is not None}
        bad = [i for i, v in diffs.items() if not math.isfinite(v) or v != 0]
        row.append(f"{key}: identical {len(diffs) - len(bad)}/{len(diffs)} first diff at {min(bad) if bad else None} max {max(diffs.values(), default=float('nan')):.3e}")
    print(" | ".join(row))
PY
R b_ut_moe_tiny 90 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_moe_tiny --model tiny-moe --warmup 2 --steps 8 --profile-steps 1"
R c_ut_moe_30b 190 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_moe_30b --model moe-30b-a3b-shape --microbatches 4 --warmup 2 --steps 6 --profile-steps 1"
for m in tiny 30b; do grep -h "^| \(eager\|ours\)\|refused\|peak\|paired" "$LOGS/ut_moe_$m/useful_tokens.md" 2>/dev/null | cut -c1-330 | head -12; done
table
