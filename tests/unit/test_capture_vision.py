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
    assert _vision().frame_seqlens(grid).tolist() == [24, 4, 4, 64]


def test_padded_cu_seqlens_puts_padding_in_its_own_segment():
    vision = _vision()
    cu = vision.padded_cu_seqlens(torch.tensor([24, 4, 4, 64]), budget=128, length=8)
    assert cu.dtype == torch.int32
    assert cu.tolist() == [0, 24, 28, 32, 96, 128, 128, 128]


def test_padded_cu_seqlens_exact_fit_needs_no_padding_segment():
    cu = _vision().padded_cu_seqlens(torch.tensor([64, 64]), budget=128, length=4)
    assert cu.tolist() == [0, 64, 128, 128]


@pytest.mark.parametrize(
    ("seqlens", "budget", "length"),
    [([100, 29], 128, 8), ([8] * 6, 64, 7), ([8] * 8, 64, 8)],
    ids=["over_budget", "no_room_for_padding_segment", "too_many_segments"],
)
def test_padded_cu_seqlens_refuses_what_does_not_fit(seqlens, budget, length):
    with pytest.raises(ValueError, match="do not fit budget"):
        _vision().padded_cu_seqlens(torch.tensor(seqlens), budget=budget, length=length)


def test_a_graph_set_loads_a_microbatch_into_the_static_inputs_in_place():
    rotary, cu = torch.full((8, 1, 1, 4), 7.0), torch.full((5,), -1, dtype=torch.int32)
    graphs = _vision().GraphSet(layers=[], rotary=rotary, cu_seqlens=cu)
    ptrs = (rotary.data_ptr(), cu.data_ptr())
    graphs.load(torch.ones(3, 1, 1, 4), torch.tensor([2, 1]))
    assert (graphs.rotary.data_ptr(), graphs.cu_seqlens.data_ptr()) == ptrs  # what the layers were captured with
    assert graphs.rotary[:3].eq(1).all() and graphs.rotary[3:].eq(0).all()  # the last micro-batch's rows are gone
    assert graphs.cu_seqlens.dtype == torch.int32 and graphs.cu_seqlens.tolist() == [0, 2, 3, 8, 8]


def test_a_copy_taken_by_a_failed_forward_is_free_again():
    copies = _vision().GraphCopies(1)
    index = copies.acquire()
    assert copies.acquire() is None
    copies.release_now(index)
    assert copies.in_flight() == 0 and copies.acquire() == 0
