"""What the static ``cu_seqlens`` length costs TE attention: one vision layer's attention (Qwen3-VL-2B shapes: 16
heads of 64, bf16), fwd+bwd on the same packed tokens, with the real segments only vs padded with zero-length
segments to the length the vision graphs capture, and upstream's one unmasked segment.

    python scripts/probe_thd_segments.py OUT.json

Prints a table and writes OUT.json (command, date, GPU, versions, TE's chosen backend per case)."""

from __future__ import annotations

import json
import os
import sys
import time

import torch


def _time(fn, iters: int = 30, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main(out: str) -> None:
    """Time each case, write OUT, print a table."""
    from transformer_engine.pytorch import DotProductAttention

    heads, dim, budget = 16, 64, 3072
    real = [784, 576, 960, 588]  # four images' patches (as in the benchmark's 2B data), 2908 of 3072
    rows = []
    torch.manual_seed(0)
    for name, lengths, total_entries in (
        ("thd real segments + padding segment", real, len(real) + 2),
        ("thd padded to 50 entries (max 48 frames)", real, 50),
        ("thd padded to 10 entries (max 8 frames)", real, 10),
    ):
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        cu.append(budget)
        cu += [budget] * (total_entries - len(cu))
        cu_t = torch.tensor(cu, dtype=torch.int32, device="cuda")
        attn = DotProductAttention(heads, dim, attn_mask_type="padding", qkv_format="thd").cuda()
        q, k, v = (
            torch.randn(budget, heads, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
        )

        def step(attn=attn, q=q, k=k, v=v, cu_t=cu_t):
            o = attn(q, k, v, cu_seqlens_q=cu_t, cu_seqlens_kv=cu_t, max_seqlen_q=budget, max_seqlen_kv=budget)
            o.sum().backward()

        rows.append({"case": name, "cu_seqlens_entries": total_entries, "fwd_bwd_ms": _time(step)})
    attn = DotProductAttention(heads, dim, attn_mask_type="no_mask", qkv_format="sbhd").cuda()
    q, k, v = (
        torch.randn(budget, 1, heads, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
    )
    rows.append(
        {
            "case": "sbhd one unmasked segment (upstream)",
            "cu_seqlens_entries": None,
            "fwd_bwd_ms": _time(lambda: attn(q, k, v).sum().backward()),
        }
    )
    from importlib.metadata import version

    meta = {
        "command": " ".join(["python", *sys.argv]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "transformer_engine": version("transformer-engine"),
        "env": {k: v for k, v in os.environ.items() if k.startswith("NVTE_")},
    }
    with open(out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=2)
    for r in rows:
        print(f"{r['case']:45s} {r['fwd_bwd_ms']:8.3f} ms")


if __name__ == "__main__":
    main(sys.argv[1])
