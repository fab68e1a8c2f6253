"""Qwen3-VL's deepstack and image-token merges by row positions (:mod:`bridge_cudagraph.host.row_merge`), on the CPU
against Bridge's own: values and gradients bit for bit, a count mismatch refused. That nothing waits is what the GPU
tests count (``tests/gpu/test_bridge_reference.py``)."""

from __future__ import annotations

import pytest
import torch
from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.transformer_block import Qwen3VLTransformerBlock

from bridge_cudagraph.host.forward_counts import ForwardCounts
from bridge_cudagraph.host.row_merge import IndexedDeepstack, VisionRows


def _deepstack_case(seed: int, batch: int = 2, seq: int = 24, hidden: int = 8):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(batch, seq, generator=g) < 0.4
    hidden_states = torch.randn(seq, batch, hidden, generator=g, dtype=torch.float64)
    embeds = torch.randn(int(mask.sum()), hidden, generator=g, dtype=torch.float64)
    return hidden_states, mask, embeds


def _merge_with_grads(method, hidden_states, mask, embeds):
    h = hidden_states.clone().requires_grad_(True)
    e = embeds.clone().requires_grad_(True)
    out = method(None, h, mask, e)
    weight = torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape).sin()
    (out * weight).sum().backward()
    return out.detach(), h.grad, e.grad


@pytest.mark.parametrize("seed", range(4))
def test_the_deepstack_merge_by_index_is_bridges_bit_for_bit(seed):
    case = _deepstack_case(seed)
    theirs = _merge_with_grads(Qwen3VLTransformerBlock._deepstack_process, *case)
    ours = _merge_with_grads(IndexedDeepstack._deepstack_process, *case)
    for name, a, b in zip(("output", "hidden-state gradient", "embedding gradient"), ours, theirs, strict=True):
        assert a.shape == b.shape and torch.equal(a, b), name
    assert not torch.equal(theirs[0], case[0])  # the merge did add something


def test_a_mask_that_does_not_hold_one_row_per_embedding_is_refused():
    """Bridge's boolean indexing raises on a count mismatch; the positions must not silently drop or repeat rows."""
    hidden_states, mask, embeds = _deepstack_case(0)
    with pytest.raises(RuntimeError):
        IndexedDeepstack._deepstack_process(None, hidden_states, mask, embeds[:-1])


def _image_merge(hidden_states, mask, embeds, counter=None):
    """Bridge's image-token merge as its forward writes it (``model.py``: the embeddings [s, b, h] to [b, s, h], the
    encoder's output assigned through the mask, back to [s, b, h]), its output and gradients; with a ``counter``
    (the install's :class:`~bridge_cudagraph.host.forward_counts.ForwardCounts`) the encoder's output is a
    :class:`VisionRows` counted there, as the install's hook makes it."""
    h = hidden_states.clone().requires_grad_(True)
    e = embeds.clone().requires_grad_(True)
    vision_embeds = e * 1.0  # a non-leaf, as the encoder's merger output is
    if counter is not None:
        vision_embeds = vision_embeds.as_subclass(VisionRows)
        vision_embeds.counts = counter
    combined = (h * 1.0).transpose(0, 1).contiguous()
    combined[mask] = vision_embeds
    out = combined.transpose(0, 1).contiguous()
    weight = torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape).cos()
    (out * weight).sum().backward()
    return out.detach(), h.grad, e.grad


@pytest.mark.parametrize("seed", range(4))
def test_the_image_merge_by_rows_is_bridges_bit_for_bit(seed):
    case = _deepstack_case(seed, batch=1 + seed % 2)
    theirs = _image_merge(*case)
    counter = ForwardCounts()
    ours = _image_merge(*case, counter=counter)
    assert counter.row_merges == 1  # the merge went by rows
    for name, a, b in zip(("output", "embedding gradient", "vision gradient"), ours, theirs, strict=True):
        assert type(a) is torch.Tensor and a.shape == b.shape and torch.equal(a, b), name
    assert not torch.equal(theirs[0], case[0])  # the merge did write something


def test_vision_rows_end_at_the_merge():
    """Every operation but the masked assignment gives plain tensors, so the type reaches nothing past the merge;
    an assignment the row merge does not take (integer positions, a value that is not the rows) is torch's own."""
    _, mask, embeds = _deepstack_case(1)
    counter = ForwardCounts()
    rows = (embeds * 1.0).as_subclass(VisionRows)
    rows.counts = counter
    for result in (rows * 2, rows[:1], rows.to(torch.float32), torch.cat([rows, rows]), rows.transpose(0, 1)):
        assert type(result) is torch.Tensor
    target = torch.zeros(len(rows) + 2, rows.shape[1], dtype=rows.dtype)
    target[torch.arange(len(rows))] = rows
    assert type(target) is torch.Tensor and torch.equal(target[: len(rows)], embeds)
    plain = torch.zeros(*mask.shape, embeds.shape[1], dtype=embeds.dtype)
    plain[mask] = embeds
    assert counter.row_merges == 0
    ours = torch.zeros_like(plain)
    ours[mask] = rows
    assert torch.equal(ours, plain) and counter.row_merges == 1


def test_an_image_merge_mask_that_does_not_hold_one_row_per_embedding_is_refused():
    """Bridge's boolean assignment raises on a count mismatch; the row merge must not drop or repeat rows silently."""
    hidden_states, mask, embeds = _deepstack_case(0)
    with pytest.raises(RuntimeError):
        _image_merge(hidden_states, mask, embeds[:-1], counter=ForwardCounts())
