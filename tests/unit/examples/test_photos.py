"""The photo set through Bridge's own dataset build and Qwen-VL collate, on CPU, as Bridge's training reads it."""

from __future__ import annotations

import pytest
import torch

from bridge_cudagraph.examples.photos import PHOTOS, SPLITS, PhotoSetSpec, build_photo_set, photo_sample
from bridge_cudagraph.examples.processor import SPECIAL_TOKENS

SPEC = PhotoSetSpec(sizes=(8, 2, 2))


def test_samples_are_real_photos_of_varied_sizes_and_deterministic():
    names = {p.name for p in PHOTOS}
    samples = [photo_sample(PhotoSetSpec(), "train", i) for i in range(40)]
    sizes = {image.size for _, image, _ in samples}
    assert len(sizes) > 30 and {n for n, _, _ in samples} <= names
    assert min(max(s) for s in sizes) >= 128 and max(max(s) for s in sizes) <= 1024
    assert len({round(w / h, 1) for w, h in sizes}) >= 5
    again = photo_sample(PhotoSetSpec(), "train", 7)
    assert again[2] == samples[7][2] and again[1].tobytes() == samples[7][1].tobytes()


def test_build_is_cached_and_byte_identical(tmp_path):
    first = build_photo_set(tmp_path / "a", SPEC)
    second = build_photo_set(tmp_path / "b", SPEC)
    for split in SPLITS:
        assert (first / f"{split}.parquet").read_bytes() == (second / f"{split}.parquet").read_bytes()
    stamp = (first / "train.parquet").stat().st_mtime_ns
    assert build_photo_set(tmp_path / "a", SPEC) == first and (first / "train.parquet").stat().st_mtime_ns == stamp


@pytest.fixture(scope="module")
def bridge_batches(tmp_path_factory):
    """Two builds from scratch; from each, Bridge's datasets (its provider registry) and two collated micro-batches."""
    from megatron.bridge.data.utils import get_dataset_provider

    from bridge_cudagraph.examples.photo_recipe import build_photo_data, photo_dataset_config

    out = []
    for build in ("first", "second"):
        root = tmp_path_factory.mktemp(build)
        photos, processor = build_photo_data(root, SPEC)
        config = photo_dataset_config(photos, processor, seq_length=2048)
        config.finalize()
        train, valid, test = get_dataset_provider(config)([6, 2, 2], config, tokenizer=None)
        loader = torch.utils.data.DataLoader(train, batch_size=2, collate_fn=train.collate_fn, shuffle=False)
        out.append((processor, [batch for _, batch in zip(range(2), loader, strict=False)], (valid, test)))
    return out


def test_bridges_collate_gives_what_qwen3_vl_step_reads(bridge_batches):
    processor, batches, (valid, test) = bridge_batches[0]
    assert len(valid) == 2 and len(test) == 2  # the validation and test parquet files are found by name
    for batch in batches:
        assert {"input_ids", "labels", "loss_mask", "position_ids", "visual_inputs"} <= set(batch)
        assert "cu_seqlens_q" not in batch and "cu_seqlens" not in batch  # packing is deferred to the step
        ids, labels, loss = batch["input_ids"], batch["labels"], batch["loss_mask"]
        assert ids.shape[0] == 2 and ids.shape == labels.shape == loss.shape and ids.shape[1] % 128 == 0
        visual = batch["visual_inputs"].normalized_for_model()
        grid = visual["image_grid_thw"]
        assert grid.shape == (2, 3) and visual["pixel_values"].shape == (int(grid.prod(-1).sum()), 3 * 2 * 16 * 16)
        for row, thw in zip(range(2), grid, strict=True):
            assert int((ids[row] == processor.image_token_id).sum()) == int(thw.prod()) // 4
        # Loss only on the assistant's tokens: each loss position predicts a token after "<|im_start|>assistant\n".
        for row in range(2):
            where = loss[row].nonzero().flatten()
            assert len(where) > 0 and torch.equal(labels[row][where], ids[row][where + 1])
            # the last turn's <|im_start|>, then "assistant\n": the first label is the answer's first token
            assistant = (ids[row] == SPECIAL_TOKENS["<|im_start|>"]).nonzero().flatten()[-1] + 2
            assert int(where.min()) >= int(assistant) - 1
            vision = [processor.image_token_id, processor.vision_start_token_id, processor.vision_end_token_id]
            assert not torch.isin(ids[row][where + 1], torch.tensor(vision)).any()
            assert (labels[row][loss[row] == 0] == -100).all()


def test_two_builds_give_identical_batches(bridge_batches):
    (_, first, _), (_, second, _) = bridge_batches
    for a, b in zip(first, second, strict=True):
        for key in ("input_ids", "labels", "loss_mask", "position_ids", "attention_mask"):
            assert torch.equal(a[key], b[key]), key
        va, vb = a["visual_inputs"].normalized_for_model(), b["visual_inputs"].normalized_for_model()
        assert torch.equal(va["pixel_values"], vb["pixel_values"])
        assert torch.equal(va["image_grid_thw"], vb["image_grid_thw"])
