"""capture.static_inputs: the rungs of one copy share their static input buffers."""

from __future__ import annotations

import torch


def test_static_buffers_give_each_rung_a_view_of_one_buffer():
    """Rungs of one copy share their static inputs: views of the first rows of the largest rung's buffer, leaves
    that take a gradient of their own; a larger rung later gets a new buffer and the old views keep theirs."""
    from bridge_cudagraph.capture.static_inputs import StaticBuffers

    statics = StaticBuffers(device="cpu")
    top = statics.view("h", (8, 1, 4), torch.float32, requires_grad=True)
    small = statics.view("h", (4, 1, 4), torch.float32, requires_grad=True)
    assert small.data_ptr() == top.data_ptr() and small.is_leaf and small.requires_grad
    (small * 2).sum().backward()
    assert small.grad.shape == (4, 1, 4) and top.grad is None
    assert statics.nbytes() == 8 * 4 * 4
    larger = statics.view("h", (16, 1, 4), torch.float32)
    assert larger.data_ptr() != top.data_ptr() and top.shape == (8, 1, 4)
    statics.clear()
    assert statics.nbytes() == 0
