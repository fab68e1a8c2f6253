"""What cuDNN's deterministic attention backward asks for, against the plan's estimate of it.

The plan keeps a derived static vision or packed-language attention shape within a workspace limit under TE's
deterministic kernels and counts that workspace into the graphs' memory
(:func:`bridge_cudagraph.plan.determinism.workspace_bytes`). A graph's shape has every static segment, zero-length
ones too, so the estimate must hold where most segments are empty, where counts and lengths are not powers of
two, and at small shapes, where cuDNN asks for its floor. This test runs TE's own ``DotProductAttention`` (THD, no
mask, bf16, the vision encoder's 16 heads of 64) forward and backward at such shapes and measures what the backward
allocates beyond its three input gradients: within a tenth below the estimate and never above it (plus a small
allowance for the kernel's own buffers).

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

#: (static segments, segments holding ``length`` tokens, length): the rest of the segments are empty, as a graph's
#: unused image slots are. Counts and lengths off powers of two, where the two estimates part.
SHAPES = [(2, 2, 256), (3, 2, 256), (5, 2, 200), (2, 2, 376), (59, 2, 96)]


def _backward_bytes(segments: int, filled: int, length: int) -> int:
    """Bytes the attention backward allocates beyond ``dq, dk, dv`` at this static shape."""
    import torch
    from transformer_engine.pytorch import DotProductAttention

    attention = DotProductAttention(HEADS, HEAD_DIM, qkv_format="thd", attn_mask_type="padding").cuda()
    total = filled * length
    q, k, v = (
        torch.randn(total, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
    )
    ends = [min(i + 1, filled) * length for i in range(segments)]
    cu_seqlens = torch.tensor([0, *ends], dtype=torch.int32, device="cuda")
    out = attention(
        q, k, v, cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens, max_seqlen_q=length, max_seqlen_kv=length
    )
    grad = torch.ones_like(out)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out.backward(grad)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    return peak - 3 * q.numel() * q.element_size()


@pytest.mark.parametrize(("segments", "filled", "length"), SHAPES)
def test_the_plans_estimate_is_what_cudnn_asks(segments, filled, length, record):
    from bridge_cudagraph.plan.determinism import WORKSPACE_BYTES_PER_ELEMENT, workspace_bytes

    measured = _backward_bytes(segments, filled, length)
    estimate = workspace_bytes(segments, HEADS, length)
    unrounded = WORKSPACE_BYTES_PER_ELEMENT * segments * HEADS * length**2
    record(
        segments=segments,
        filled=filled,
        length=length,
        measured_bytes=measured,
        estimate_bytes=estimate,
        unrounded_bytes=unrounded,
    )
    assert 0.9 * estimate <= measured <= estimate + ALLOWANCE, (
        f"{segments} segments ({filled} of {length} tokens) x {HEADS} heads: the backward allocated "
        f"{measured / 2**20:.0f} MiB, the plan estimates {estimate / 2**20:.0f} MiB "
        f"(unrounded {unrounded / 2**20:.0f} MiB)"
    )
