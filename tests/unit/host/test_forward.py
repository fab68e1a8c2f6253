"""Qwen3-VL's forward with fewer host waits (:mod:`bridge_cudagraph.host.forward`), on the CPU against Bridge's own
functions: the deepstack merge and the image-token merge by row positions give Bridge's values and gradients bit for
bit, and the positions from the host copy are Bridge's ``get_rope_index`` output for every path its forward takes
(padded rows, one flat packed row of several sequences, the step's packed rows). That nothing waits is what the GPU
test counts (``tests/gpu/test_bridge_reference.py``)."""

from __future__ import annotations

import types
import weakref

import pytest
import torch
from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.rope import get_rope_index
from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.transformer_block import Qwen3VLTransformerBlock
from megatron.core.packed_seq_params import PackedSeqParams

from bridge_cudagraph.examples.data import qwen3_vl_batch
from bridge_cudagraph.examples.tiny import IMAGE_TOKEN_ID, VIDEO_TOKEN_ID, VISION_START_TOKEN_ID
from bridge_cudagraph.host.forward import IndexedDeepstack, RowMerge, VisionRows, rope_positions

MERGE = 2


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
    (a :class:`~bridge_cudagraph.host.forward.RowMerge`) the encoder's output is a :class:`VisionRows` counted there,
    as the mixin's hook makes it."""
    h = hidden_states.clone().requires_grad_(True)
    e = embeds.clone().requires_grad_(True)
    vision_embeds = e * 1.0  # a non-leaf, as the encoder's merger output is
    if counter is not None:
        vision_embeds = vision_embeds.as_subclass(VisionRows)
        vision_embeds.owner = weakref.ref(counter)
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
    counter = RowMerge()
    ours = _image_merge(*case, counter=counter)
    assert counter.row_merges == 1  # the merge went by rows
    for name, a, b in zip(("output", "embedding gradient", "vision gradient"), ours, theirs, strict=True):
        assert type(a) is torch.Tensor and a.shape == b.shape and torch.equal(a, b), name
    assert not torch.equal(theirs[0], case[0])  # the merge did write something


def test_vision_rows_end_at_the_merge():
    """Every operation but the masked assignment gives plain tensors, so the type reaches nothing past the merge;
    an assignment the row merge does not take (integer positions, a value that is not the rows) is torch's own."""
    _, mask, embeds = _deepstack_case(1)
    counter = RowMerge()
    rows = (embeds * 1.0).as_subclass(VisionRows)
    rows.owner = weakref.ref(counter)
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
        _image_merge(hidden_states, mask, embeds[:-1], counter=RowMerge())


def _owner():
    """What :func:`~bridge_cudagraph.host.forward.rope_positions` reads of the model: its config's merge size and
    the token ids."""
    return types.SimpleNamespace(
        config=types.SimpleNamespace(spatial_merge_size=MERGE),
        image_token_id=IMAGE_TOKEN_ID,
        video_token_id=VIDEO_TOKEN_ID,
        vision_start_token_id=VISION_START_TOKEN_ID,
    )


def _bridge_positions(kwargs, packed):
    positions, _ = get_rope_index(
        MERGE,
        IMAGE_TOKEN_ID,
        VIDEO_TOKEN_ID,
        VISION_START_TOKEN_ID,
        kwargs["input_ids"],
        image_grid_thw=kwargs.get("image_grid_thw"),
        video_grid_thw=None,
        attention_mask=None,
        packed_seq_params=packed,
    )
    return positions


def _packed(cu_seqlens: list[int]) -> PackedSeqParams:
    cu = torch.tensor(cu_seqlens, dtype=torch.int32)
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        cu_seqlens_q_padded=cu.clone(),
        cu_seqlens_kv_padded=cu.clone(),
        max_seqlen_q=int((cu[1:] - cu[:-1]).max()),
        max_seqlen_kv=int((cu[1:] - cu[:-1]).max()),
    )


IMAGES = [[(1, 4, 4), (1, 8, 4)], [], [(1, 4, 8)]]


def test_padded_rows_get_bridges_positions():
    kwargs = qwen3_vl_batch(IMAGES, 96, seed=3, device="cpu")
    ours = rope_positions(_owner(), kwargs)
    theirs = _bridge_positions(kwargs, None)
    assert ours.shape == (3, 3, 96) and ours.dtype == kwargs["input_ids"].dtype
    assert torch.equal(ours, theirs)
    assert not torch.equal(ours[1], ours[0])  # the images' height rows differ from the temporal ones


def test_one_flat_packed_row_gets_bridges_positions_per_sequence():
    """One row holding three sequences (Bridge's flat THD path of ``get_rope_index``, offsets read on the host)."""
    rows = qwen3_vl_batch(IMAGES, 64, seed=5, device="cpu")
    kwargs = {"input_ids": rows["input_ids"].reshape(1, -1), "image_grid_thw": rows["image_grid_thw"]}
    packed = _packed([0, 64, 128, 192])
    kwargs["packed_seq_params"] = packed
    ours = rope_positions(_owner(), kwargs)
    theirs = _bridge_positions(kwargs, packed)
    assert torch.equal(ours, theirs)
    assert int(ours[0, 0, 64]) == 0  # the second sequence starts again at 0
    assert kwargs["packed_seq_params"] is packed  # the caller's parameters are left as they were


def test_the_steps_packed_rows_get_the_positions_bridge_derives_before_packing():
    """Bridge's Qwen3-VL step hands several rows with packed parameters (its forward's legacy packed BSHD path):
    the forward derives their positions unpacked (``packed_seq_params=None``) and packs them itself afterwards."""
    kwargs = qwen3_vl_batch(IMAGES, 64, seed=9, device="cpu")
    kwargs["packed_seq_params"] = _packed([0, 64, 128, 192])
    ours = rope_positions(_owner(), kwargs)
    assert torch.equal(ours, _bridge_positions(kwargs, None))
