"""Qwen3-VL's mRoPE positions from CPU copies (:mod:`bridge_cudagraph.host.rope_index`), on the CPU against Bridge's
own ``get_rope_index``, for every path its forward takes (padded rows, one flat packed row of several sequences, the
step's packed rows). That nothing waits is what the GPU tests count (``tests/gpu/test_bridge_reference.py``,
``tests/gpu/test_packed_language.py``)."""

from __future__ import annotations

import types

import torch
from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.rope import get_rope_index
from megatron.core.packed_seq_params import PackedSeqParams

from bridge_cudagraph.examples.data import qwen3_vl_batch
from bridge_cudagraph.examples.tiny import IMAGE_TOKEN_ID, VIDEO_TOKEN_ID, VISION_START_TOKEN_ID
from bridge_cudagraph.host.rope_index import rope_positions

MERGE = 2


def _owner():
    """What :func:`~bridge_cudagraph.host.rope_index.rope_positions` reads of the model: its config's merge size and
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
