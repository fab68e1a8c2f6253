"""Does zero-padding the token dimension change Transformer Engine's numbers? A probe, issue #17 (section 4).

Packed language graphs replay a micro-batch of ``T`` real tokens at a static budget ``B >= T``: the tail
``B - T`` rows are zeros (their own attention segment, no loss). Mathematically nothing changes; numerically a
kernel whose reduction split depends on the row count can: the weight gradient of a linear layer reduces over
the token rows (``dW = dY^T X``, K = tokens), and so do the norm weights' gradients (``dgamma``). If cuBLAS
picks another algorithm or split-K for K = B than for K = T, or the norm's backward another row partition, the
graphed run differs from eager by rounding, even under ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0``.

This probe runs TE's own modules, eagerly, on ``T`` rows and on the same rows padded with zeros to the budget
the plan's ladder would give them, and counts where the outputs and gradients are not bit-identical. Modules: the
tiny Qwen3-VL language layer's ``LayerNormLinear`` (RMSNorm + QKV), ``Linear`` (projection, FC2) and
``LayerNormLinear`` (RMSNorm + FC1), the per-head q/k ``RMSNorm``, at the tiny and the 2B hidden sizes.

    NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 python -m benchmarks.padded_shapes_probe --out probe.json

Needs a GPU. Prints one line per (shape, module) and writes the counts as JSON: ``differs`` counts differing
tensors over the padded cases (``out`` and ``dgrad``: one per case; ``wgrad``: every parameter's gradient, so a
norm + linear module counts its weight and its norm's weight and bias apart).
"""

from __future__ import annotations

import argparse
import json
import os

SHAPES = {
    # name: (hidden, ffn, heads, query groups, head dim, norm): the tiny language model, the Qwen3-VL-2B language
    # shape, the tiny vision encoder and Qwen3-VL-8B's vision encoder (LayerNorm, no grouped queries).
    "tiny": (512, 1536, 8, 4, 64, "RMSNorm"),
    "2b": (2048, 6144, 16, 8, 128, "RMSNorm"),
    "vision_tiny": (256, 512, 4, 4, 64, "LayerNorm"),
    "vision_8b": (1152, 4304, 16, 16, 72, "LayerNorm"),
}


def _modules(hidden: int, ffn: int, heads: int, groups: int, head_dim: int, norm: str):
    import torch
    import transformer_engine.pytorch as te

    kw = dict(params_dtype=torch.bfloat16, device="cuda")
    qkv = (heads + 2 * groups) * head_dim
    return {
        "norm_qkv": te.LayerNormLinear(hidden, qkv, bias=False, normalization=norm, **kw),
        "proj": te.Linear(heads * head_dim, hidden, bias=False, **kw),
        "norm_fc1": te.LayerNormLinear(
            hidden, (2 if norm == "RMSNorm" else 1) * ffn, bias=False, normalization=norm, **kw
        ),
        "fc2": te.Linear(ffn, hidden, bias=False, **kw),
        **({"qk_norm": te.RMSNorm(head_dim, **kw)} if norm == "RMSNorm" else {}),
    }


def _forward_backward(module, x, dy=None):
    """Output, input gradient, every parameter gradient and the upstream gradient of one forward + backward;
    ``dy`` None draws a fixed one (seed 7) of the output's shape."""
    import torch

    module.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(True)
    y = module(x)
    if dy is None:
        g = torch.Generator(device="cuda").manual_seed(7)
        dy = torch.randn(y.shape, generator=g, device="cuda", dtype=torch.float32).to(y.dtype)
    y.backward(dy)
    return y.detach(), x.grad, {n: p.grad.clone() for n, p in module.named_parameters()}, dy


def probe(tokens: list[int], budgets: list[int], shapes: list[str]) -> list[dict]:
    """For each shape and module: how many padded cases differ from unpadded ones, per output kind, and by how much."""
    import torch

    rows = []
    for shape in shapes:
        hidden, ffn, heads, groups, head_dim, norm = SHAPES[shape]
        torch.manual_seed(0)
        mods = _modules(hidden, ffn, heads, groups, head_dim, norm)
        for name, module in mods.items():
            in_features = {"proj": heads * head_dim, "fc2": ffn, "qk_norm": head_dim}.get(name, hidden)
            per_row = heads + 2 * groups if name == "qk_norm" else 1  # q/k norm: one row per head per token
            counts = {"out": 0, "dgrad": 0, "wgrad": 0}
            worst = {"out": 0.0, "dgrad": 0.0, "wgrad": 0.0}
            cases = 0
            for t in tokens:
                b = next(x for x in budgets if x >= t)
                if b == t:
                    continue
                cases += 1
                torch.manual_seed(t)
                real = torch.randn(t * per_row, in_features, device="cuda", dtype=torch.bfloat16)
                padded = torch.cat([real, real.new_zeros((b - t) * per_row, in_features)])
                y1, dx1, g1, dy = _forward_backward(module, real)
                tail = dy.new_zeros((b - t) * per_row, dy.size(1))
                y2, dx2, g2, _ = _forward_backward(module, padded, torch.cat([dy, tail]))
                pairs = {
                    "out": [(y1, y2[: t * per_row])],
                    "dgrad": [(dx1, dx2[: t * per_row])],
                    "wgrad": [(g1[n], g2[n]) for n in g1],
                }
                for what, items in pairs.items():
                    for a, c in items:
                        assert torch.isfinite(a).all() and torch.isfinite(c).all(), (shape, name, t, what)
                        if not torch.equal(a, c):
                            counts[what] += 1
                            d = float((a.float() - c.float()).abs().max() / a.float().abs().max().clamp_min(1e-30))
                            worst[what] = max(worst[what], d)
            row = dict(shape=shape, module=name, cases=cases, differs=counts, worst_rel=worst)
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main(argv=None) -> int:
    """Probe every multiple of ``--step`` real tokens at the plan ladder's budget for it; write the JSON."""
    from bridge_cudagraph.plan.budgets import derive_language_budgets

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--max-tokens", type=int, default=4096, help="micro batch x seq_length (the main job: 2 x 2048)")
    p.add_argument("--multiple", type=int, default=32, help="the packed width's rounding (micro batch x 16)")
    p.add_argument("--step", type=int, default=128, help="real token counts probed: multiples of this")
    p.add_argument("--shapes", default="tiny,2b")
    p.add_argument("--budgets", default=None, help="comma-separated budgets (default: the language ladder)")
    args = p.parse_args(argv)
    if args.budgets:
        budgets = sorted(int(b) for b in args.budgets.split(","))
    else:
        budgets = derive_language_budgets(args.max_tokens, multiple=args.multiple)
    tokens = list(range(args.step, args.max_tokens + 1, args.step))
    rows = probe(tokens, budgets, args.shapes.split(","))
    meta = dict(
        deterministic=os.environ.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO") == "0", budgets=budgets, tokens=tokens
    )
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
