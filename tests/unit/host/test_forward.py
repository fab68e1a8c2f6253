"""Qwen3-VL's forward with fewer host waits (:mod:`bridge_cudagraph.host.forward`), on the CPU against Bridge's own
functions: the deepstack merge and the image-token merge by row positions give Bridge's values and gradients bit for
bit, and the positions from the host copy are Bridge's ``get_rope_index`` output for every path its forward takes
(padded rows, one flat packed row of several sequences, the step's packed rows), and the step's packed rows handed
flat are what Bridge's own packing makes of them (``preprocess_packed_seqs`` under real tensor-parallel groups, the
deepstack round trip). That nothing waits is what the GPU tests count (``tests/gpu/test_bridge_reference.py``,
``tests/gpu/test_packed_language.py``)."""

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
from bridge_cudagraph.host.forward import IndexedDeepstack, RowMerge, VisionRows, flat_step_rows, rope_positions

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


# ------------------------------------------------------------------ the step's packed rows handed flat
def _flat_owner(pg_collection, *, dropout: float = 0.0, training: bool = True):
    """What :func:`~bridge_cudagraph.host.forward.flat_step_rows` reads of the model: its groups, whether it trains,
    and its embedding's dropout."""
    return types.SimpleNamespace(
        pg_collection=pg_collection,
        training=training,
        pre_process=True,
        language_model=types.SimpleNamespace(config=types.SimpleNamespace(hidden_dropout=dropout)),
    )


def _sizes(tp: int = 1, cp: int = 1):
    group = types.SimpleNamespace  # sizes only: the GPU tests and the world below use real groups
    return types.SimpleNamespace(tp=group(size=lambda: tp), cp=group(size=lambda: cp))


def _step_rows(rows: int = 2, width: int = 32) -> dict:
    kwargs = qwen3_vl_batch([[(1, 4, 4)]] + [[]] * (rows - 1), width, seed=3, device="cpu")
    kwargs["packed_seq_params"] = _packed([width * i for i in range(rows + 1)])
    kwargs["position_ids"] = torch.arange(3 * rows * width).reshape(3, rows, width)
    kwargs["attention_mask"] = None
    return kwargs


@pytest.mark.fast
def test_the_steps_rows_are_handed_flat_as_views():
    kwargs = _step_rows()
    flat = flat_step_rows(_flat_owner(_sizes()), kwargs)
    assert flat is not None and flat["input_ids"].shape == (1, 64) and flat["position_ids"].shape == (3, 1, 64)
    assert flat["input_ids"].data_ptr() == kwargs["input_ids"].data_ptr()  # views: filled later, read there
    assert flat["position_ids"].data_ptr() == kwargs["position_ids"].data_ptr()
    assert flat["packed_seq_params"] is kwargs["packed_seq_params"] and flat["labels"] is kwargs["labels"]
    assert torch.equal(flat["position_ids"][:, 0, 32:], kwargs["position_ids"][:, 1])  # row 1 follows row 0
    # The step's all-ones keep-mask of the rows' shape: flat too, the mask's values checked on the host copy by
    # FlatPackedRows (the GPU tests: a mask that drops tokens raises); the flat forward reads none.
    masked = flat_step_rows(_flat_owner(_sizes()), {**kwargs, "attention_mask": torch.ones(2, 32, dtype=torch.bool)})
    assert masked is not None and masked["attention_mask"] is None


@pytest.mark.fast
@pytest.mark.parametrize(
    ("change", "owner"),
    [
        ({"attention_mask": torch.ones(2, 1, 32, 32, dtype=torch.bool)}, {}),  # not the rows' keep-mask
        ({"image_input_mask": torch.zeros(2, 32, dtype=torch.bool)}, {}),  # Bridge reads it in the rows' shape
        ({"packed_seq_params": None}, {}),  # BSHD rows: nothing to pack
        ({"position_ids": None}, {}),  # the forward would derive them from the flat tokens, not per row
        ({"position_ids": torch.arange(64).reshape(2, 32)}, {}),  # 2-D positions are not mRoPE's
        ({}, {"cp": 2}),  # context parallelism splits each row
        ({}, {"tp": 3}),  # 32 is not a multiple of 3: Bridge pads each row
        ({}, {"dropout": 0.1}),  # the embedding's dropout mask would fall on the other layout
    ],
    ids=["4d_mask", "image_mask", "bshd", "no_positions", "2d_positions", "cp2", "tp3", "dropout"],
)
def test_anything_but_the_steps_unpadded_rows_is_left_to_bridge(change, owner):
    kwargs = {**_step_rows(), **change}
    sizes = _sizes(tp=owner.get("tp", 1), cp=owner.get("cp", 1))
    assert flat_step_rows(_flat_owner(sizes, dropout=owner.get("dropout", 0.0)), kwargs) is None


@pytest.mark.fast
def test_one_row_and_dropout_outside_training():
    one = _step_rows(rows=1)
    assert flat_step_rows(_flat_owner(_sizes()), one) is None  # already one THD row: Bridge's own branch
    assert flat_step_rows(_flat_owner(_sizes(), dropout=0.1, training=False), _step_rows()) is not None


def _bridge_packs_flat(rank: int, world_size: int) -> dict:
    """Under Bridge's tensor-parallel collection of 2 ranks: Bridge's ``preprocess_packed_seqs`` of the step's rows
    (no attention mask: the forward's ones) against the flat rows, for the tokens, the embeddings and the positions
    as the forward calls it, and the deepstack round trip as the forward writes it; and a width Bridge pads."""
    from _dist import bridge_collection
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.utils import preprocess_packed_seqs

    pgc = bridge_collection({"tp": 2})
    out: dict[str, bool] = {}
    for width in (32, 31):
        kwargs = _step_rows(width=width)
        tokens = kwargs["input_ids"]
        ones = torch.ones_like(tokens, dtype=torch.bool)
        flat = flat_step_rows(_flat_owner(pgc), kwargs)
        packed_tokens = preprocess_packed_seqs(tokens, ones, pre_process=True, pg_collection=pgc)[0]
        out[f"flat_{width}"] = flat is not None
        if flat is None:
            out[f"bridge_pads_{width}"] = packed_tokens.shape[1] > tokens.numel()
            continue
        g = torch.Generator().manual_seed(width)
        embeddings = torch.randn(*tokens.shape, 8, generator=g)  # [b, s, h], as the forward packs them
        positions = kwargs["position_ids"]
        packed_positions = preprocess_packed_seqs(positions.permute(1, 2, 0), ones, True, pgc)[0].permute(2, 0, 1)
        out["tokens"] = torch.equal(packed_tokens, flat["input_ids"])
        out["embeddings"] = torch.equal(
            preprocess_packed_seqs(embeddings, ones, True, pgc)[0], embeddings.reshape(1, -1, 8)
        )
        out["positions"] = torch.equal(packed_positions.contiguous(), flat["position_ids"])
        # The deepstack round trip (model.py's legacy branch): scattered by the rows' mask into zeros, packed,
        # gathered by the flat rows' mask: each feature back row for row.
        mask = tokens == IMAGE_TOKEN_ID
        feature = torch.randn(int(mask.sum()), 8, generator=g)
        tmp = torch.zeros_like(embeddings)
        tmp[mask] = feature
        tmp_thd = preprocess_packed_seqs(tmp.contiguous(), ones, True, pgc)[0]
        out["deepstack"] = int(mask.sum()) > 0 and torch.equal(tmp_thd[packed_tokens == IMAGE_TOKEN_ID], feature)
    return out


@pytest.mark.slow
def test_the_flat_rows_are_bridges_own_packing_under_tensor_parallel_groups():
    from _dist import run_world

    for result in run_world(2, _bridge_packs_flat):
        assert result == {
            "flat_32": True,
            "tokens": True,
            "embeddings": True,
            "positions": True,
            "deepstack": True,
            "flat_31": False,
            "bridge_pads_31": True,
        }, result
