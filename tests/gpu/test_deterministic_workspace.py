"""What cuDNN's deterministic attention backward asks for, against the plan's estimate of it.

The plan keeps a derived ladder's top within a workspace limit under TE's deterministic kernels and counts that
workspace into the graphs' memory (:func:`bridge_cudagraph.plan.determinism.workspace_bytes`). A graph's static
shape has the budget's tokens in pieces of at most ``max_seqlen``, then zero-length segments up to the static count.
This test runs TE's own ``DotProductAttention`` (THD, padding mask, bf16, heads of 64: the vision encoder's 16, and
8 and 32) forward and backward at such shapes, the tokens, the segments and ``max_seqlen`` each varied with the
others held (the workspace follows the first two and not the third), and measures what the backward allocates
beyond its three input gradients: within a hundredth below the estimate and never above it (plus a small allowance
for the kernel's own buffers).

    NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 python -m pytest tests/gpu/test_deterministic_workspace.py -q -rA
"""

from __future__ import annotations

import os

import pytest

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        os.environ.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO") != "0",
        reason="the deterministic backward's workspace needs NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 set before TE is "
        "imported",
    ),
]

HEADS = 16
HEAD_DIM = 64
#: Room for what the backward allocates besides the workspace and the input gradients (softmax statistics, the
#: output gradient's layout copy): far below any workspace here.
ALLOWANCE = 64 * 2**20

#: (heads, static segments, tokens, max_seqlen): the 2B vision rungs' 63 segments at 256 patches, over their tokens
#: and against fewer segments and other lengths; the floors (32 segments, 1024 tokens); the earlier shapes; and other
#: head counts (the tiny GPT's 8, an 8B language layer's 32).
SHAPES = [
    (HEADS, 63, 3200, 256),
    (HEADS, 63, 3200, 96),
    (HEADS, 63, 2048, 256),
    (HEADS, 63, 1088, 96),
    (HEADS, 63, 512, 256),
    (HEADS, 2, 3200, 256),
    (HEADS, 32, 3200, 256),
    (HEADS, 4, 4096, 1024),
    (HEADS, 59, 192, 96),
    (HEADS, 2, 752, 376),
    (HEADS, 5, 400, 200),
    (8, 16, 512, 256),
    (32, 63, 2048, 256),
]


def _backward_bytes(heads: int, segments: int, tokens: int, max_seqlen: int) -> int:
    """Bytes the attention backward allocates beyond ``dq, dk, dv`` at this static shape."""
    import torch
    from transformer_engine.pytorch import DotProductAttention

    attention = DotProductAttention(heads, HEAD_DIM, qkv_format="thd", attn_mask_type="padding").cuda()
    q, k, v = (
        torch.randn(tokens, heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
    )
    ends = [*range(min(max_seqlen, tokens), tokens, max_seqlen), tokens][:segments]
    cu_seqlens = torch.tensor([0, *ends, *[tokens] * (segments - len(ends))], dtype=torch.int32, device="cuda")
    out = attention(
        q, k, v, cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens, max_seqlen_q=max_seqlen, max_seqlen_kv=max_seqlen
    )
    grad = torch.ones_like(out)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out.backward(grad)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del q, k, v, out, grad
    torch.cuda.empty_cache()
    return peak - 3 * tokens * heads * HEAD_DIM * 2


@pytest.mark.parametrize(("heads", "segments", "tokens", "max_seqlen"), SHAPES)
def test_the_plans_estimate_is_what_cudnn_asks(heads, segments, tokens, max_seqlen, record):
    from bridge_cudagraph.plan.determinism import workspace_bytes

    measured = _backward_bytes(heads, segments, tokens, max_seqlen)
    estimate = workspace_bytes(segments, heads, tokens)
    record(
        heads=heads,
        segments=segments,
        tokens=tokens,
        max_seqlen=max_seqlen,
        measured_bytes=measured,
        estimate_bytes=estimate,
    )
    assert 0.99 * estimate <= measured <= estimate + ALLOWANCE, (
        f"{segments} segments, {tokens} tokens, max_seqlen {max_seqlen} x {heads} heads: the backward allocated "
        f"{measured / 2**20:.0f} MiB, the plan estimates {estimate / 2**20:.0f} MiB"
    )
