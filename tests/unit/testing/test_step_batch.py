"""testing.step_batch: a collated micro-batch in both forms, through Bridge's own Qwen3-VL step functions, under a
real (gloo) process-group collection."""

from __future__ import annotations

from _dist import run_world

SEQ = 512
WIDTHS = (150, 96)  # real tokens per row; the collate pads both to 150
IMAGE = 1000


def _collated():
    import torch
    from megatron.bridge.training.utils.visual_inputs import GenericVisualInputs

    g = torch.Generator().manual_seed(3)
    width = max(WIDTHS)
    ids = torch.zeros(len(WIDTHS), width, dtype=torch.long)
    loss = torch.zeros(len(WIDTHS), width)
    attention = torch.zeros(len(WIDTHS), width, dtype=torch.long)
    for r, n in enumerate(WIDTHS):
        ids[r, :n] = torch.randint(3, 900, (n,), generator=g)
        ids[r, 5:21] = IMAGE  # one image of 16 merged tokens (8 x 8 patches) per row
        loss[r, n // 2 : n - 1] = 1.0
        attention[r, :n] = 1
    labels = torch.where(loss > 0, torch.roll(ids, -1, 1), torch.full_like(ids, -100))
    grid = torch.tensor([[1, 8, 8], [1, 8, 8]])
    return {
        "input_ids": ids,
        "labels": labels,
        "loss_mask": loss,
        "attention_mask": attention,
        "position_ids": torch.arange(width).expand(len(WIDTHS), -1).contiguous(),
        "visual_inputs": GenericVisualInputs(pixel_values=torch.randn(128, 1536, generator=g), image_grid_thw=grid),
    }


def _forms(rank: int, world: int) -> dict:
    import torch

    from bridge_cudagraph.parallel.groups import build_collections
    from bridge_cudagraph.parallel.layout import ParallelLayout
    from bridge_cudagraph.testing.parity import model_kwargs
    from bridge_cudagraph.testing.step_batch import CPU_GRIDS, qwen3_vl_step_inputs

    pgc = build_collections(ParallelLayout(), None, world_size=world, backend="gloo")["language"]
    collated = _collated()
    packed = qwen3_vl_step_inputs(collated, pgc, packed=True, seq_length=SEQ, device="cpu")
    padded = qwen3_vl_step_inputs(collated, pgc, packed=False, pad_to_seq_length=True, seq_length=SEQ, device="cpu")
    unforced = qwen3_vl_step_inputs(collated, pgc, packed=False, seq_length=SEQ, device="cpu")
    params = packed["packed_seq_params"]
    width = packed["input_ids"].size(1)
    return {
        "width": width,
        "packed_shapes": {k: tuple(v.shape) for k, v in packed.items() if torch.is_tensor(v)},
        "padded_shapes": {k: tuple(v.shape) for k, v in padded.items() if torch.is_tensor(v)},
        "unforced_width": unforced["input_ids"].size(1),
        "cu_seqlens": params.cu_seqlens_q.tolist(),
        "cu_seqlens_padded": params.cu_seqlens_q_padded.tolist(),
        "separate_padded": params.cu_seqlens_q_padded is not params.cu_seqlens_q,
        "max_seqlen": params.max_seqlen_q,
        "qkv_format": params.qkv_format,
        "attention_all_true": bool(packed["attention_mask"].all()) and packed["attention_mask"].dtype == torch.bool,
        "none_in_padded": [k for k in ("attention_mask", "position_ids", "packed_seq_params") if padded[k] is None],
        "position_ids_packed": packed["position_ids"],
        "loss": [
            float(collated["loss_mask"].sum()),
            float(packed["loss_mask"].sum()),
            float(padded["loss_mask"].sum()),
        ],
        # the packed row r is positions [r * width, (r + 1) * width) of the THD sequence
        "rows_kept": all(
            torch.equal(packed["labels"].reshape(2, -1)[r, : len(collated["labels"][r])], collated["labels"][r])
            and torch.equal(padded["input_ids"][r, : collated["input_ids"].size(1)], collated["input_ids"][r])
            for r in range(2)
        ),
        "pad_values": [
            int(padded["input_ids"][:, collated["input_ids"].size(1) :].abs().sum()),
            bool((padded["labels"][:, collated["input_ids"].size(1) :] == -100).all()),
        ],
        "visual": sorted(k for k in ("pixel_values", "image_grid_thw") if k in packed and k in padded),
        "cpu_grid_is_the_collates": all(
            torch.equal(form[CPU_GRIDS].grids["image_grid_thw"], collated["visual_inputs"].image_grid_thw)
            and form[CPU_GRIDS].grids["image_grid_thw"].device.type == "cpu"
            for form in (packed, padded)
        ),
        "cpu_grid_not_a_model_argument": CPU_GRIDS not in model_kwargs(packed)
        and CPU_GRIDS not in model_kwargs(padded),
    }


def test_both_forms_are_what_bridges_qwen3_vl_step_hands_the_model():
    (got,) = run_world(1, _forms)
    width = got["width"]
    assert width == 160  # 150 rounded up to 16 (use_fp8_padding), as the step does
    assert got["packed_shapes"]["input_ids"] == (2, width)
    assert got["packed_shapes"]["labels"] == got["packed_shapes"]["loss_mask"] == (1, 2 * width)
    assert got["cu_seqlens"] == got["cu_seqlens_padded"] == [0, width, 2 * width] and got["separate_padded"]
    assert got["qkv_format"] == "thd" and got["max_seqlen"] == width and got["attention_all_true"]
    assert got["position_ids_packed"] is None
    assert got["padded_shapes"]["input_ids"] == got["padded_shapes"]["labels"] == (2, SEQ)
    assert got["none_in_padded"] == ["attention_mask", "position_ids", "packed_seq_params"]
    assert got["unforced_width"] == width  # without the force the step pads to the batch, not to seq_length
    assert got["loss"][0] == got["loss"][1] == got["loss"][2] > 0
    assert got["rows_kept"] and got["pad_values"] == [0, True]
    assert got["visual"] == ["image_grid_thw", "pixel_values"]
    # The collate's grid on the CPU beside the model's (vision.cpu_grids), which the forward step keeps.
    assert got["cpu_grid_is_the_collates"] and got["cpu_grid_not_a_model_argument"]
