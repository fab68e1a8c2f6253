"""The MFU column's FLOP count, on numbers small enough to count by hand (CPU)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks import flops


def test_language_flops_count_the_matmuls_and_the_causal_pairs():
    # h 4, 1 layer, ffn 8, 2 heads of 2, 2 KV groups, vocab 10, no GLU; one row of 3 tokens.
    p = SimpleNamespace(
        hidden_size=4,
        num_layers=1,
        ffn_hidden_size=8,
        num_attention_heads=2,
        num_query_groups=2,
        kv_channels=2,
        vocab_size=10,
        gated_linear_unit=False,
    )
    # per token: QKV 2*4*6*2 = 96, projection 2*2*2*4 = 32, MLP 2*4*8 + 2*8*4 = 128 -> 256; attention over the
    # 3*4/2 = 6 causal pairs: 2*2*2*2*6 = 96; logits 2*4*10 per token. Forward 256*3 + 96 + 240 = 1104, x3.
    assert flops.language_flops(p, 1, 3) == 3 * 1104
    p.gated_linear_unit = True  # SwiGLU: the MLP's input projection twice as wide
    assert flops.language_flops(p, 1, 3) == 3 * (1104 + 3 * 2 * 4 * 8)


def test_vision_frames_and_mfu():
    assert flops.frames_of([(2, 4, 4), (1, 2, 2)]) == [16, 16, 4]
    assert flops.peak_tflops("NVIDIA H200") == flops.PEAK_BF16_TFLOPS["H200"]
    assert flops.peak_tflops("some other GPU") is None
    assert flops.mfu(989.5e12 * 0.1, 1000.0, 989.5) == pytest.approx(0.1)  # 0.1 s of peak work in 1 s
    assert flops.mfu(None, 10.0, 989.5) is None and flops.mfu(1.0, 10.0, None) is None
    v = SimpleNamespace(
        hidden_size=2,
        intermediate_size=4,
        depth=1,
        spatial_merge_size=1,
        in_channels=1,
        temporal_patch_size=1,
        patch_size=1,
        out_hidden_size=2,
        deepstack_visual_indexes=[],
    )
    # 2 frames of 1 patch: embed 2*1*2*2 = 8; layer per patch 2*2*6 + 2*2*2 + 2*2*2*4 = 64 -> 128, attention
    # 2*2*2*(1 + 1) = 16; merger per token 2*2*2 + 2*2*2 = 16 -> 32. Forward 8 + 144 + 32 = 184, x3.
    assert flops.vision_flops(v, [1, 1]) == 3 * 184
