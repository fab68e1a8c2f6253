"""The vision replay's packing helpers, on host tensors as the replay path uses them (CPU).

Bit-exactness of the replay itself against Bridge's eager encoder is a GPU test (tests/gpu/test_vision_capture.py).
"""

from __future__ import annotations

import pytest
import torch


def _vision():
    from bridge_cudagraph.capture import vision  # needs Bridge importable (as the CPU suite has)

    return vision


def test_frame_seqlens_lists_every_frame_as_a_segment():
    grid = torch.tensor([[1, 4, 6], [2, 2, 2], [1, 8, 8]])
    from bridge_cudagraph.vision.encoder import frame_seqlens

    assert frame_seqlens(grid).tolist() == [24, 4, 4, 64]
    # What Bridge's layout is: torch's repeat_interleave of h*w by t, same values and dtype, also for no image.
    for g in (grid, torch.tensor([[3, 2, 5], [1, 1, 1]], dtype=torch.int32), torch.zeros((0, 3), dtype=torch.long)):
        want = torch.repeat_interleave(g[:, 1] * g[:, 2], g[:, 0])
        got = frame_seqlens(g)
        assert got.dtype == want.dtype and torch.equal(got, want)


def _layout(budget: int, segments: int, max_seqlen: int | None = None):
    from bridge_cudagraph.plan.budgets import PackedLayout

    return PackedLayout((budget,), max_sequences=segments, max_seqlen=max_seqlen or budget)


def test_padded_cu_seqlens_puts_padding_in_its_own_segment():
    vision = _vision()
    cu = vision.padded_cu_seqlens(torch.tensor([24, 4, 4, 64]), 128, _layout(128, 6))
    assert cu.dtype == torch.int32
    assert cu.tolist() == [0, 24, 28, 32, 96, 128, 128, 128]


def test_padded_cu_seqlens_exact_fit_needs_no_padding_segment():
    cu = _vision().padded_cu_seqlens(torch.tensor([64, 64]), 128, _layout(128, 2))
    assert cu.tolist() == [0, 64, 128, 128]


def test_padding_is_split_into_segments_no_longer_than_the_longest_frame_allowed():
    """A capped ``max_seqlen`` (the static attention length) splits the padding, so no segment exceeds it."""
    cu = _vision().padded_cu_seqlens(torch.tensor([24]), 128, _layout(128, 2, max_seqlen=32))
    assert cu.tolist() == [0, 24, 56, 88, 120, 128, 128]


@pytest.mark.parametrize(
    ("seqlens", "budget", "segments"),
    [([100, 29], 128, 6), ([8] * 6, 64, 5), ([8] * 8, 64, 6)],
    ids=["over_budget", "one_segment_too_many", "too_many_segments"],
)
def test_padded_cu_seqlens_refuses_what_does_not_fit(seqlens, budget, segments):
    with pytest.raises(ValueError, match="do not fit"):
        _vision().padded_cu_seqlens(torch.tensor(seqlens), budget, _layout(budget, segments))


def test_a_graph_set_loads_a_microbatch_into_the_static_inputs_in_place():
    rotary, cu = torch.full((8, 1, 1, 4), 7.0), torch.full((5,), -1, dtype=torch.int32)
    graphs = _vision().GraphSet(layers=[], rotary=rotary, cu_seqlens=cu, segments=())
    ptrs = (rotary.data_ptr(), cu.data_ptr())
    graphs.load(torch.ones(3, 1, 1, 4), torch.tensor([2, 1]), _layout(8, 3))
    assert (graphs.rotary.data_ptr(), graphs.cu_seqlens.data_ptr()) == ptrs  # what the layers were captured with
    assert graphs.rotary[:3].eq(1).all() and graphs.rotary[3:].eq(0).all()  # the last micro-batch's rows are gone
    assert graphs.cu_seqlens.dtype == torch.int32 and graphs.cu_seqlens.tolist() == [0, 2, 3, 8, 8]


def test_a_copy_taken_by_a_failed_forward_is_free_again():
    copies = _vision().GraphCopies(1)
    index = copies.acquire()
    assert copies.acquire() is None
    copies.release_now(index)
    assert copies.in_flight() == 0 and copies.acquire() == 0


def test_vision_segments_end_at_every_deepstack_layer():
    """One derivation for the plan and the capture: ranges [start, end) that cover the stack once, each deepstack
    layer the last of its range (so no graph has a second output), or single layers."""
    from bridge_cudagraph.plan.budgets import layer_segments

    assert layer_segments(24, (5, 11, 17), "run") == ((0, 6), (6, 12), (12, 18), (18, 24))
    assert layer_segments(27, [8, 16, 24], "run") == ((0, 9), (9, 17), (17, 25), (25, 27))
    assert layer_segments(4, (1, 2), "run") == ((0, 2), (2, 3), (3, 4))
    assert layer_segments(4, (3,), "run") == ((0, 4),)  # the last layer's output is the graph's own
    assert layer_segments(4, (), "run") == ((0, 4),)
    assert layer_segments(3, (1,), "layer") == ((0, 1), (1, 2), (2, 3))
    with pytest.raises(ValueError, match="encoder"):
        layer_segments(4, (1,), "encoder")  # tried and withdrawn: not bit-exact across a deepstack layer


def test_language_segments_cut_after_each_merge_on_the_first_stage_only():
    """Qwen3-VL's decoder adds a deepstack feature after each of its first layers, on pipeline stage 0 only."""
    from bridge_cudagraph.plan.budgets import language_segments

    assert language_segments(28, 3, first_stage=True, unit="run") == ((0, 1), (1, 2), (2, 3), (3, 28))
    assert language_segments(14, 3, first_stage=False, unit="run") == ((0, 14),)
    assert language_segments(4, 0, first_stage=True, unit="run") == ((0, 4),)  # GPT
    assert language_segments(3, 3, first_stage=True, unit="run") == ((0, 1), (1, 2), (2, 3))
    assert language_segments(3, 2, first_stage=True, unit="layer") == ((0, 1), (1, 2), (2, 3))


def test_graph_unit_is_checked_with_the_fix():
    from bridge_cudagraph.config import CudaGraphConfigError, VisionGraphConfig

    VisionGraphConfig(enabled=True, graph_unit="layer").validate()
    with pytest.raises(CudaGraphConfigError, match=r"graph_unit='encoder'.*'run'"):
        VisionGraphConfig(enabled=True, graph_unit="encoder").validate()
    with pytest.raises(
        CudaGraphConfigError, match=r"graph_unit='deepstack' was renamed: set .*graph_unit=run"
    ) as info:
        VisionGraphConfig(enabled=True, graph_unit="deepstack").validate("model.cuda_graph.vision")
    assert info.value.fix == ("model.cuda_graph.vision.graph_unit=run",)
