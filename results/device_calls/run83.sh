#!/usr/bin/env bash
# Device call of run 83 (2026-12-04): #46's first step, where the padded path's gradient gap lies. The useful-tokens
# benchmark on the 2B shape (sequence 4096, micro-batch 2, 2 micro-batches a step) with every parameter's gradient
# compared on the fixed micro-batch against its reference's and the eager-vs-eager floor (the reference's own second
# forward/backward): eager_padded, ours_padded and its parts (one language graph per layer, language graphs only,
# vision graphs only), eager_packed, ours_packed. Few steps: the question is the fixed batch.
#   bash .devwheels/install.sh >/dev/null 2>&1; bash .snap/run83.sh
set +e
export LOGS=/tmp/dl_run83
source scripts/device_lib.sh
prologue
export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
R a_ut_grads 480 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_grads --model small --seq 4096 --mbs 2 --num-mb 2 --steps 2 --warmup 3 --profile-steps 0 --no-paired --no-control --variants eager_padded,ours_padded,ours_padded_layer_graphs,ours_padded_language,ours_padded_vision,eager_packed,ours_packed"
python3 - "$LOGS/ut_grads/useful_tokens.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for name, v in d["variants"].items():
    p = v.get("parity") or {}
    f = p.get("fixed_batch") or {}
    g = f.get("grads") or {}
    fl = p.get("floor") or {}
    print(f"{name:26s} {v.get('status')} norm {p.get('fixed_batch_grad_norm')} loss {f.get('loss_max_abs')} "
          f"exact {g.get('grad_exact_fraction')} max {g.get('grad_max_rel_l2')} floor {f.get('floor_grad_max_rel_l2')} "
          f"within {f.get('within_floor')} missing {len(g.get('grad_missing') or [])} err {str(v.get('error'))[:150]}")
    for w in (g.get("grad_worst_params") or [])[:8]:
        print(f"    {w['name'][:90]:90s} rel {w['rel_l2']:.3e} norm {w['norm']:.4g} ref {w['reference_norm']:.4g}")
    if fl:
        print(f"    floor: exact {fl.get('grad_exact_fraction')} max {fl.get('grad_max_rel_l2')} {fl.get('grad_worst')}")
PY
table
