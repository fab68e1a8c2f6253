"""The step's packed rows handed to Bridge's forward flat (:mod:`bridge_cudagraph.host.flat_rows`): what Bridge's own
packing makes of them (``preprocess_packed_seqs`` under real tensor-parallel groups, the deepstack round trip), and
everything else left to Bridge."""

from __future__ import annotations

import types

import pytest
import torch
from megatron.core.packed_seq_params import PackedSeqParams

from bridge_cudagraph.examples.data import qwen3_vl_batch
from bridge_cudagraph.examples.tiny import IMAGE_TOKEN_ID
from bridge_cudagraph.host.flat_rows import flat_step_rows


def _packed(cu_seqlens: list[int]) -> PackedSeqParams:
    cu = torch.tensor(cu_seqlens, dtype=torch.int32)
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu)


def _flat_owner(pg_collection, *, dropout: float = 0.0, training: bool = True):
    """What :func:`~bridge_cudagraph.host.flat_rows.flat_step_rows` reads of the model: its groups, whether it trains,
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
