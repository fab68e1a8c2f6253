"""The per-image-size position cache gives Bridge's own position tensors, bit for bit, values and gradients.

Bridge's ``Qwen3VLVisionModel.fast_pos_embed_interpolate`` and ``rot_pos_emb`` run here unchanged, bound to a small
module that carries exactly the attributes they read (the learned position table, the grid side, the merge size, and
Bridge's rotary module); the encoder itself needs a GPU to be built. Micro-batches mix image sizes, repeat them
(cache hits), hold video frames (t > 1) and overflow a small cache (eviction).
"""

from __future__ import annotations

import types

import pytest
import torch

from bridge_cudagraph.vision.positions import GridPositions

MERGE = 2
SIDE = 48  # Qwen3-VL: 2304 learned positions, a 48 x 48 grid
HEAD_DIM = 64


def _encoder(dtype: torch.dtype):
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.utils import Qwen3VLVisionRotaryEmbedding
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.vision_model import Qwen3VLVisionModel

    class Encoder(torch.nn.Module):
        fast_pos_embed_interpolate = Qwen3VLVisionModel.fast_pos_embed_interpolate
        rot_pos_emb = Qwen3VLVisionModel.rot_pos_emb

        def __init__(self):
            super().__init__()
            self.pos_embed = torch.nn.Embedding(SIDE * SIDE, 32, dtype=dtype)
            self.num_grid_per_side = SIDE
            self.spatial_merge_size = MERGE
            self.config = types.SimpleNamespace(spatial_merge_size=MERGE)
            self.rotary_pos_emb = rotary = Qwen3VLVisionRotaryEmbedding(HEAD_DIM // 2)
            # Bridge's module makes this buffer on its first call, on the current CUDA device: here on the CPU,
            # by the same formula (utils.py:82)
            exponents = torch.arange(0, rotary.dim, 2, dtype=torch.float) / rotary.dim
            rotary.register_buffer("inv_freq", 1.0 / (rotary.theta**exponents), persistent=False)

    torch.manual_seed(0)
    return Encoder()


MICRO_BATCHES = [
    [(1, 16, 16)],
    [(1, 16, 16), (1, 28, 40), (2, 8, 12)],  # a repeat, a new size, two video frames
    [(1, 28, 40), (1, 16, 16)],  # both seen: every image a hit
    [(1, 64, 48), (1, 6, 10), (1, 28, 40)],  # larger than the table's side, and small
    [(1, 16, 16), (1, 2, 2), (3, 4, 6)],
]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.uint8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cached_positions_are_bridges_bit_for_bit(dtype):
    encoder = _encoder(dtype)
    cache = GridPositions(max_sizes=4)
    for images in MICRO_BATCHES:
        grid = torch.tensor(images)
        n = int(grid.prod(dim=1).sum())
        upstream = encoder.fast_pos_embed_interpolate(grid)
        ours, rotary = cache.positions(encoder, grid)
        assert ours.shape == upstream.shape == (n, 32) and ours.dtype == upstream.dtype
        assert torch.equal(_bits(ours), _bits(upstream)), images
        probe = torch.randn(n, 32, dtype=dtype)
        (g_up,) = torch.autograd.grad((upstream * probe).sum(), encoder.pos_embed.weight)
        (g_ours,) = torch.autograd.grad((ours * probe).sum(), encoder.pos_embed.weight)
        assert torch.equal(_bits(g_ours), _bits(g_up)), images
        rotary_up = encoder.rot_pos_emb(grid).reshape(n, 1, 1, -1).repeat(1, 1, 1, 2)
        assert rotary.shape == rotary_up.shape and torch.equal(_bits(rotary), _bits(rotary_up)), images
    assert cache.hits > 0 and cache.misses > 0
    assert len(cache._sizes) == 4  # the least recently used sizes left


def test_a_changed_table_is_read_not_cached():
    """The learned table is read on every call: after an optimizer-like update the values follow it."""
    encoder = _encoder(torch.float32)
    cache = GridPositions()
    grid = torch.tensor([(1, 16, 16)])
    before = cache.positions(encoder, grid)[0].detach().clone()
    with torch.no_grad():
        encoder.pos_embed.weight.mul_(2.0)
    after = cache.positions(encoder, grid)[0]
    assert cache.hits == 1
    assert torch.equal(after, encoder.fast_pos_embed_interpolate(grid)) and not torch.equal(after, before)
