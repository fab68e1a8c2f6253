"""What cuDNN's deterministic THD attention backward allocates beyond dq/dk/dv, over static shapes like the vision
rungs' (16 heads of 64, bf16): total tokens T, segments b (cu_seqlens length - 1), max_seqlen s, filled pieces of
at most s then zero-length segments. One JSON line per shape; an OOM records the size asked for.

Run 115 ran this script as .snap/sweep.py under NVTE_ALLOW_NONDETERMINISTIC_ALGO=0; it is kept here reformatted for
ruff: the same shapes in the same order, the same measurement and output. One change: the allocator's cache is
emptied after a shape's tensors are freed (the run emptied it while they were still held, which the measurement,
taken from the peak above the allocation before the backward, does not see).
"""

import json
import re

import torch
from transformer_engine.pytorch import DotProductAttention

H, D = 16, 64
att = DotProductAttention(H, D, qkv_format="thd", attn_mask_type="padding").cuda()


def cu(total: int, b: int, s: int) -> list[int]:
    """The static cu_seqlens: pieces of at most ``s`` up to ``total``, the first ``b``, then zero-length segments."""
    ends = [*range(min(s, total), total, s), total][:b]
    return [0, *ends, *([total] * (b - len(ends)))]


def measure(total: int, b: int, s: int, tag: str) -> None:
    """Print one shape's record: what the backward allocated beyond dq/dk/dv, or what an OOM asked for."""
    rec: dict = {"tag": tag, "tokens": total, "segments": b, "max_seqlen": s}
    try:
        q, k, v = (torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        c = torch.tensor(cu(total, b, s), dtype=torch.int32, device="cuda")
        out = att(q, k, v, cu_seqlens_q=c, cu_seqlens_kv=c, max_seqlen_q=s, max_seqlen_kv=s)
        g = torch.ones_like(out)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        out.backward(g)
        torch.cuda.synchronize()
        rec["bytes"] = torch.cuda.max_memory_allocated() - before - 3 * q.numel() * 2
    except torch.OutOfMemoryError as e:
        m = re.search(r"Tried to allocate ([\d.]+) (GiB|MiB)", str(e))
        rec["oom_asked_gib"] = float(m.group(1)) / (1 if m.group(2) == "GiB" else 1024) if m else None
    rec["gib"] = round(rec.get("bytes", 0) / 2**30, 3)
    print(json.dumps(rec), flush=True)


shapes = []
for T in (256, 512, 1024, 2048, 3200, 4096, 8192):  # A: tokens at b=63, s=256 (the 2B vision rungs)
    shapes.append((T, 63, 256, "A tokens"))
for b in (2, 8, 16, 32, 63, 64, 65, 128):  # B: segments at T=3200, s=256
    shapes.append((3200, b, 256, "B segments"))
for s in (64, 128, 200, 256, 384, 512):  # C: max_seqlen at T=3200, b=63
    shapes.append((3200, 63, s, "C max_seqlen"))
for T in (320, 1088, 3200):  # E: the rung at s=96 (the W test's 59-segment length)
    shapes.append((T, 59, 96, "E"))
KNOWN = ((192, 59, 96), (512, 2, 256), (4096, 2, 2048), (8192, 4, 2048), (4096, 4, 1024))  # F: W's and run 106's
for T, b, s in KNOWN:
    shapes.append((T, b, s, "F known"))
for T, b, s, tag in shapes:
    measure(T, b, s, tag)
    torch.cuda.empty_cache()
