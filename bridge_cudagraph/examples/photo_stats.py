"""Token and image-size distribution of the photo set, measured through Bridge's own dataset build and collate.

``python -m bridge_cudagraph.examples.photo_stats [SAMPLES]`` prints what ``README.md`` beside this file quotes:
per sample the tokens Bridge's ``qwen2_5_collate_fn`` makes (the processor's real image tokens at the collate's
own ``min_pixels``/``max_pixels``), the image tokens, the tokens that carry loss, the stored image sizes; and the
fill fraction (real tokens / token slots computed) of micro-batches of 2 at sequence 1024/2048/4096 three ways:
padded to the sequence length (what static graphs replay today), padded to the micro-batch's longest sample
(what Bridge's Qwen3-VL step does with ``defer_in_batch_packing_to_step``: one THD segment per row), and
concatenated into the smallest of four budgets (the sequence's multiples x2, x1, x1/2, x1/4: the budget ladder
of packed graphs).
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

__all__ = ["collated_stats", "fill_fractions", "report"]


def _pairs(dataset, count: int):
    for start in range(0, count - 1, 2):
        yield [dataset[start], dataset[start + 1]]


def collated_stats(dataset_config, samples: int) -> dict[str, np.ndarray]:
    """Per-sample numbers of the first ``samples`` training samples, built and collated as Bridge's training does.

    The dataset comes from ``megatron.bridge.data.utils.get_dataset_provider(config)`` (the call Bridge's
    ``setup`` makes), the batches from its ``collate_fn`` two at a time (micro-batch 2).
    """
    from megatron.bridge.data.utils import get_dataset_provider

    from bridge_cudagraph.host.compat import dataset_processor

    train, _, _ = get_dataset_provider(dataset_config)([samples, 0, 0], dataset_config, tokenizer=None)
    image_id = dataset_processor(train).image_token_id
    rows: dict[str, list] = {"tokens": [], "image_tokens": [], "loss_tokens": [], "width": [], "height": []}
    for pair in _pairs(train, samples):
        batch = train.collate_fn(pair)
        mask = batch["attention_mask"].bool()
        rows["tokens"] += mask.sum(1).tolist()
        rows["image_tokens"] += (batch["input_ids"] == image_id).sum(1).tolist()
        rows["loss_tokens"] += batch["loss_mask"].sum(1).int().tolist()
        for example in pair:
            image = example["conversation"][0]["content"][0]["image"]
            rows["width"].append(image.width)
            rows["height"].append(image.height)
    return {key: np.asarray(values) for key, values in rows.items()}


def fill_fractions(tokens: np.ndarray, seq_length: int, micro_batch: int = 2) -> dict[str, float]:
    """Real tokens / computed token slots for consecutive micro-batches of ``tokens`` (per-sample lengths)."""
    groups = [tokens[i : i + micro_batch] for i in range(0, len(tokens) - micro_batch + 1, micro_batch)]
    fits = [g for g in groups if g.max() <= seq_length]
    real = sum(int(g.sum()) for g in fits)
    padded = micro_batch * seq_length * len(fits)
    # Bridge: the collate pads to a multiple of 128, the step's THD rows are that long.
    row_max = sum(micro_batch * min(seq_length, math.ceil(int(g.max()) / 128) * 128) for g in fits)
    ladder = [micro_batch * seq_length * f for f in (1, 0.5, 0.25, 0.125)]
    budgets = sum(min(b for b in ladder if b >= int(g.sum())) for g in fits)
    return {
        "micro_batches_that_fit": len(fits) / len(groups),
        "padded": real / padded,
        "bridge_row_max": real / row_max,
        "concatenated": real / budgets,
    }


def _q(values: np.ndarray) -> str:
    p = np.percentile(values, [0, 50, 90, 100])
    return " / ".join(str(round(v)) for v in p)


def report(stats: dict[str, np.ndarray]) -> str:
    """The markdown table of :func:`collated_stats` (min / median / p90 / max) and the fill fractions."""
    pixels = stats["width"] * stats["height"]
    lines = [
        f"samples: {len(stats['tokens'])}",
        "",
        "| per sample | min / median / p90 / max |",
        "|---|---|",
        f"| tokens (collated) | {_q(stats['tokens'])} |",
        f"| image tokens | {_q(stats['image_tokens'])} |",
        f"| text tokens | {_q(stats['tokens'] - stats['image_tokens'])} |",
        f"| loss tokens (assistant) | {_q(stats['loss_tokens'])} |",
        f"| image long side, px | {_q(np.maximum(stats['width'], stats['height']))} |",
        f"| image short side, px | {_q(np.minimum(stats['width'], stats['height']))} |",
        f"| image megapixels x100 | {_q(pixels / 1e4)} |",
        "",
        "| seq | micro-batches that fit | padded to seq | Bridge (row = batch max) | concatenated, 4 budgets |",
        "|---|---|---|---|---|",
    ]
    for seq in (1024, 2048, 4096):
        f = fill_fractions(stats["tokens"], seq)
        lines.append(
            f"| {seq} | {f['micro_batches_that_fit']:.0%} | {f['padded']:.0%} | {f['bridge_row_max']:.0%} "
            f"| {f['concatenated']:.0%} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Build (or find) the photo set, measure ``SAMPLES`` (default 256) training samples, print the tables."""
    from bridge_cudagraph.examples.photo_recipe import build_photo_data, photo_dataset_config

    argv = sys.argv[1:] if argv is None else argv
    samples = int(argv[0]) if argv else 256
    photos, processor = build_photo_data()
    config: Any = photo_dataset_config(photos, processor, seq_length=4096)
    print(report(collated_stats(config, samples)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
