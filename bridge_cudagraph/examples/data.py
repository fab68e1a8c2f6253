"""Synthetic micro-batches, made in-process from a seed: text for GPT, interleaved text and images of chosen
sizes for Qwen3-VL (pixels, ``image_grid_thw`` and the image tokens the language model expects)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from bridge_cudagraph.examples.tiny import IMAGE_TOKEN_ID, TINY_VOCAB, VISION_END_TOKEN_ID, VISION_START_TOKEN_ID

#: Text tokens are drawn below this id, so they never collide with the special ids of the tiny vocabulary.
_TEXT_VOCAB = 900

#: The images of one two-sample micro-batch that the tiny parity checks feed :func:`qwen3_vl_batch`, grids
#: ``(t, h, w)`` in patches per sample: none, one, several of different sizes (the largest 12 x 12 patches).
IMAGE_MIXES: dict[str, list[list[tuple[int, int, int]]]] = {
    "no_image": [[], []],
    "one_image": [[(1, 8, 8)], []],
    "several_sizes": [[(1, 8, 8), (1, 8, 12)], [(1, 16, 8), (1, 4, 4), (1, 12, 12)]],
}


def gpt_batch(micro_batch_size: int, seq_length: int, *, seed: int, device: str = "cuda") -> dict:
    """Random text; labels are the next token."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, _TEXT_VOCAB, (micro_batch_size, seq_length + 1), generator=g)
    return {
        "input_ids": tokens[:, :-1].contiguous().to(device),
        "labels": tokens[:, 1:].contiguous().to(device),
        "position_ids": torch.arange(seq_length).expand(micro_batch_size, -1).contiguous().to(device),
        "attention_mask": None,
    }


def patches_of(grid: Sequence[int]) -> int:
    """Patches of one image with grid ``(t, h, w)`` (in patches): the unit the vision layers run on."""
    t, h, w = grid
    return t * h * w


def qwen3_vl_batch(
    images_per_sample: Sequence[Sequence[tuple[int, int, int]]],
    seq_length: int,
    *,
    seed: int,
    patch_dim: int = 3 * 2 * 16 * 16,
    merge: int = 2,
    device: str = "cuda",
) -> dict:
    """One micro-batch: sample ``i`` holds the images ``images_per_sample[i]`` (grids ``(t, h, w)`` in patches).

    Each image appears as ``<vision_start> <image>*(t*h*w/merge**2) <vision_end>`` at a seeded position, the rest
    is random text, and every sample is exactly ``seq_length`` tokens (static shapes, as graphs need). Image-token
    positions are masked out of the loss, as Bridge's VLM collate does.
    """
    g = torch.Generator().manual_seed(seed)
    rows, masks, grids = [], [], []
    for images in images_per_sample:
        pieces: list[torch.Tensor] = []
        for grid in images:
            n_tokens = patches_of(grid) // (merge * merge)
            pieces.append(torch.randint(3, _TEXT_VOCAB, (int(torch.randint(1, 8, (1,), generator=g)),), generator=g))
            pieces.append(torch.tensor([VISION_START_TOKEN_ID] + [IMAGE_TOKEN_ID] * n_tokens + [VISION_END_TOKEN_ID]))
            grids.append(grid)
        used = sum(p.numel() for p in pieces)
        if used + 1 > seq_length + 1:
            raise ValueError(f"images {list(images)} need {used} tokens, more than seq_length {seq_length}")
        pieces.append(torch.randint(3, _TEXT_VOCAB, (seq_length + 1 - used,), generator=g))
        row = torch.cat(pieces)
        rows.append(row)
        masks.append((row[1:] != IMAGE_TOKEN_ID).float())
    tokens = torch.stack(rows)
    n_patches = sum(patches_of(gr) for gr in grids)
    pixel_values = torch.randn(n_patches, patch_dim, generator=g).to(torch.bfloat16)
    batch: dict[str, Any] = {
        "input_ids": tokens[:, :-1].contiguous().to(device),
        "labels": tokens[:, 1:].contiguous().to(device),
        "loss_mask": torch.stack(masks).to(device),
        "attention_mask": None,
        "pixel_values": pixel_values.to(device) if n_patches else None,
        "image_grid_thw": torch.tensor(grids, dtype=torch.long, device=device) if grids else None,
    }
    assert int((batch["input_ids"] == IMAGE_TOKEN_ID).sum()) == n_patches // (merge * merge) or not grids
    return batch


def text_only_vocab() -> int:
    """Upper bound (exclusive) of the ids random text uses."""
    return min(_TEXT_VOCAB, TINY_VOCAB)
