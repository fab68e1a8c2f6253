"""Model FLOPs of a Qwen3-VL training step, for the MFU: the matrix multiplications, forward x 3, no recomputation;
attention over causal pairs (language, every position of a padded row) and full squares per image frame (vision)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: Dense BF16 tensor-core peak in TFLOP/s, by a substring of the GPU's name.
PEAK_BF16_TFLOPS = {"H200": 989.5, "H100": 989.5, "A100": 312.0, "B200": 2250.0}


def peak_tflops(device_name: str) -> float | None:
    """The dense BF16 peak of ``device_name``, None for a GPU this table does not know."""
    return next((value for key, value in PEAK_BF16_TFLOPS.items() if key in device_name), None)


def language_flops(provider: Any, batch_size: int, seq_length: int) -> float:
    """Forward + backward FLOPs of the language model on ``batch_size`` rows of ``seq_length`` tokens."""
    h, layers, ffn = provider.hidden_size, provider.num_layers, provider.ffn_hidden_size
    heads = provider.num_attention_heads
    kv_heads = provider.num_query_groups or heads
    d = provider.kv_channels or h // heads
    glu = 2 if getattr(provider, "gated_linear_unit", False) else 1
    per_token = (
        2 * h * (heads + 2 * kv_heads) * d  # QKV
        + 2 * heads * d * h  # output projection
        + 2 * h * ffn * glu  # MLP in (gate and up for SwiGLU)
        + 2 * ffn * h  # MLP out
    )
    pairs = seq_length * (seq_length + 1) / 2  # causal query-key pairs per row
    attention = 2 * 2 * heads * d * pairs  # scores and values
    tokens = batch_size * seq_length
    forward = layers * (per_token * tokens + attention * batch_size) + 2 * h * provider.vocab_size * tokens
    return 3.0 * forward


def vision_flops(vision_config: Any, frames: Sequence[int]) -> float:
    """Forward + backward FLOPs of the vision encoder (and its mergers) on frames of ``frames`` patches each."""
    hv = vision_config.hidden_size
    ffn = vision_config.intermediate_size
    depth = vision_config.depth
    merge = vision_config.spatial_merge_size**2
    patches = sum(frames)
    patch_in = vision_config.in_channels * vision_config.temporal_patch_size * vision_config.patch_size**2
    per_patch = 2 * hv * 3 * hv + 2 * hv * hv + 2 * 2 * hv * ffn  # QKV, projection, MLP in and out
    attention = sum(2 * 2 * hv * n * n for n in frames)
    merged = patches / merge
    mergers = 1 + len(getattr(vision_config, "deepstack_visual_indexes", []) or [])
    merger = merged * (2 * (merge * hv) ** 2 + 2 * merge * hv * vision_config.out_hidden_size)
    forward = 2 * patch_in * hv * patches + depth * (per_patch * patches + attention) + mergers * merger
    return 3.0 * forward


def frames_of(grids: Iterable[Sequence[int]]) -> list[int]:
    """Patches per attention segment (each frame of each image) of ``(t, h, w)`` grids."""
    return [int(h) * int(w) for t, h, w in grids for _ in range(int(t))]


def step_flops(provider: Any, micro_batches: Sequence[Mapping[str, Any]]) -> float:
    """Model FLOPs of one training step over ``micro_batches`` (``input_ids``, ``image_grid_thw``)."""
    total = 0.0
    for batch in micro_batches:
        rows, seq = batch["input_ids"].shape
        total += language_flops(provider, int(rows), int(seq))
        if (grid := batch.get("image_grid_thw")) is not None and len(grid):
            total += vision_flops(provider.vision_config, frames_of(grid.tolist()))
    return total


def mfu(flops_per_step: float | None, step_ms: float | None, peak: float | None) -> float | None:
    """Model FLOPs utilisation of a step of ``step_ms`` at ``peak`` TFLOP/s; None when any is unknown."""
    if not flops_per_step or not step_ms or not peak:
        return None
    return flops_per_step / (step_ms * 1e-3) / (peak * 1e12)
