"""What the benchmark measures: its configurations (model, static shapes, the micro-batches cycled through) and
the run's default step counts. Pure (no torch, no GPU), shared by :mod:`benchmarks.bench` (which runs them) and
:mod:`benchmarks.bench_gpus` (which splits them over GPUs by cost).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: Timed steps per variant, after the eager warm-up steps (before capture).
DEFAULT_MEASURED_STEPS = 30
#: Timed rounds per graphed variant: the first is the full run; later ones (``--rounds``) are timing-only reruns in
#: alternating order after the control (:func:`benchmarks.bench.run_plan`). The paired phase
#: (:func:`benchmarks.bench._run_paired`) is what the ours-vs-upstream verdict rests on; extra rounds add how far
#: one variant moves between builds.
DEFAULT_ROUNDS = 1
#: Eager steps before capture (as Bridge's ``cuda_graph_warmup_steps``).
DEFAULT_WARMUP_STEPS = 3

#: Qwen3-VL's real vocabulary and special token ids (HF ``Qwen/Qwen3-VL-2B-Instruct`` config).
QWEN3_VL_VOCAB = 151936
QWEN3_VL_TOKENS = {
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}
#: Random text is drawn below the first special id.
QWEN3_VL_TEXT_END = 151643

#: Image grids ``(t, h, w)`` in patches for the small model: 196 to 4096 patches (49 to 1024 merged tokens).
SMALL_IMAGE_POOL: tuple[tuple[int, int, int], ...] = (
    (1, 14, 14),
    (1, 20, 28),
    (1, 28, 28),
    (1, 24, 32),
    (1, 30, 40),
    (1, 36, 48),
    (1, 48, 48),
    (1, 44, 60),
    (1, 64, 64),
)

#: The GPU tests' image sets for the tiny model (micro-batch 2): one, three, eight images, a two-frame video.
TINY_IMAGE_SETS: tuple = (
    (((1, 8, 8),), ()),
    (((1, 8, 8), (1, 12, 8)), ((1, 16, 12),)),
    (
        ((1, 4, 4), (1, 8, 4), (1, 8, 8), (1, 4, 12)),
        ((1, 12, 8), (1, 8, 16), (1, 12, 16), (1, 12, 12)),
    ),
    (((2, 8, 8),), ()),
)

#: Qwen3-VL's spatial merge (2 x 2 patches per language token).
MERGE = 2
#: Tokens one image takes besides its image tokens: vision start/end and up to 7 text tokens before it.
IMAGE_OVERHEAD_TOKENS = 9


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark configuration: a model, static shapes and the micro-batches cycled through."""

    name: str
    model: str
    """``"tiny"`` or ``"small"``."""
    seq_length: int
    micro_batch_size: int
    image_sets: tuple
    """One entry per distinct micro-batch: per sample, a tuple of image grids ``(t, h, w)`` in patches."""
    num_microbatches: int = 1
    description: str = ""

    def patches_per_microbatch(self) -> list[int]:
        """Vision patches of each distinct micro-batch."""
        return [sum(t * h * w for sample in mb for (t, h, w) in sample) for mb in self.image_sets]

    def frames_per_microbatch(self) -> list[int]:
        """Attention segments (image frames) of each distinct micro-batch."""
        return [sum(t for sample in mb for (t, _, _) in sample) for mb in self.image_sets]

    def vision_budgets(self) -> list[int]:
        """Ours: the plugin's vision ladder (:func:`bridge_cudagraph.plan.budgets.geometric_ladder`, rungs
        multiples of 64 patches at most 1.25x apart, as ``derive_token_budgets`` derives it from the sequence bound)
        from the data's largest micro-batch: its patches rounded up to 64, down to a 16th of that. The top here is
        what the data carries, not the bound (every token an image token), so the floor is the packed language
        ladder's (:data:`~bridge_cudagraph.plan.budgets.LANGUAGE_LADDER_FLOOR`, a top micro-batches fill too): the
        bound's 64th would add rungs far below any micro-batch, each captured for nothing."""
        from bridge_cudagraph.plan.budgets import LANGUAGE_LADDER_FLOOR, geometric_ladder, vision_ladder_multiple

        top = max([*self.patches_per_microbatch(), MERGE * MERGE])
        return geometric_ladder(top, vision_ladder_multiple(MERGE), LANGUAGE_LADDER_FLOOR)

    def vision_halvings(self) -> list[int]:
        """The vision ladder the benchmarks used before :meth:`vision_budgets`: the data's largest micro-batch rounded
        up to 1024 patches and three halvings, each a multiple of ``merge**2`` (a micro-batch pads up to half its
        rung). Kept to measure that lever on its own (useful_tokens' ``ours_packed_halvings``)."""
        from bridge_cudagraph.plan.budgets import round_up

        unit = MERGE * MERGE
        top = round_up(max([*self.patches_per_microbatch(), unit]), 1024)
        return sorted({round_up(max(unit, top >> step), unit) for step in range(4)})

    def vision_max_segments(self) -> int:
        """Ours: the static ``cu_seqlens`` length (the plugin's default, or more if the data has more frames)."""
        from bridge_cudagraph.plan.budgets import derive_max_segments

        return max(derive_max_segments(self.vision_budgets(), MERGE), *self.frames_per_microbatch())

    def upstream_vision_seq_length(self) -> int:
        """Upstream: one ``max_vision_cuda_graph_seq_length`` that holds the largest micro-batch (patches): our
        ladder's top, the largest micro-batch rounded up to 64 patches (at most 63 above it), so both variants
        capture the same largest shape."""
        return self.vision_budgets()[-1]

    def as_dict(self) -> dict:
        """For ``bench.json``."""
        return {
            "name": self.name,
            "model": self.model,
            "description": self.description,
            "seq_length": self.seq_length,
            "micro_batch_size": self.micro_batch_size,
            "num_microbatches": self.num_microbatches,
            "images": [[list(map(list, sample)) for sample in mb] for mb in self.image_sets],
            "patches_per_microbatch": self.patches_per_microbatch(),
            "frames_per_microbatch": self.frames_per_microbatch(),
            "vision_budgets": self.vision_budgets(),
            "vision_max_segments": self.vision_max_segments(),
            "upstream_vision_seq_length": self.upstream_vision_seq_length(),
        }


def image_tokens(grid: tuple[int, int, int], merge: int = MERGE) -> int:
    """Language tokens one image takes (``t*h*w / merge**2``)."""
    t, h, w = grid
    return t * h * w // (merge * merge)


def image_mix(
    seq_length: int,
    micro_batch_size: int,
    *,
    batches: int = 4,
    seed: int = 0,
    fill: float = 0.6,
    pool: Sequence[tuple[int, int, int]] = SMALL_IMAGE_POOL,
) -> tuple:
    """``batches`` micro-batches; sample ``s`` of micro-batch ``b`` holds ``1 + (b + 2s) % 4`` images drawn (seeded,
    weighted by size) from ``pool`` such that its image tokens and their delimiters stay within
    ``fill * seq_length``."""
    rng = random.Random(seed)
    cap = int(seq_length * fill)
    out = []
    for b in range(batches):
        samples = []
        for s in range(micro_batch_size):
            n = 1 + (b + 2 * s) % 4
            per_image = cap // n - IMAGE_OVERHEAD_TOKENS
            choices = [g for g in pool if image_tokens(g) <= per_image] or [min(pool, key=image_tokens)]
            weights = [image_tokens(g) for g in choices]  # larger images more often: a vision-heavy mix
            samples.append(tuple(rng.choices(choices, weights=weights, k=n)))
        out.append(tuple(samples))
    return tuple(out)


def tiny_config() -> BenchConfig:
    """The tiny Qwen3-VL of the GPU tests: seq 256, micro-batch 2."""
    return BenchConfig(
        name="tiny",
        model="tiny",
        seq_length=256,
        micro_batch_size=2,
        image_sets=TINY_IMAGE_SETS,
        description="Tiny Qwen3-VL (4 language layers of hidden 512, 4 vision layers of hidden 256), seq 256, "
        "micro-batch 2, 1 micro-batch per step; micro-batches of 1, 3 and 8 images and a two-frame video.",
    )


def small_config(micro_batch_size: int, seq_length: int) -> BenchConfig:
    """The Qwen3-VL-2B-like model at one shape."""
    return BenchConfig(
        name=f"small-mbs{micro_batch_size}-seq{seq_length}",
        model="small",
        seq_length=seq_length,
        micro_batch_size=micro_batch_size,
        image_sets=image_mix(seq_length, micro_batch_size, seed=seq_length + micro_batch_size),
        description=(
            f"Qwen3-VL-2B-like (language 28 layers x 2048, 16 heads / 8 KV groups, FFN 6144, vocab 151936, tied "
            f"embeddings; vision 24 layers x 1024, FFN 4096, deepstack [5, 11, 17]), seq {seq_length}, micro-batch "
            f"{micro_batch_size}, 1 micro-batch per step; 1-4 images of 196-4096 patches per sample."
        ),
    )


def quick_configs() -> list[BenchConfig]:
    """``--quick``: tiny and the small model at micro-batch 1, sequence 2048."""
    return [tiny_config(), small_config(1, 2048)]


def full_configs() -> list[BenchConfig]:
    """The whole matrix: tiny, and the small model at micro-batch 1 and 2 x sequence 2048 and 4096."""
    return [tiny_config()] + [small_config(mbs, seq) for seq in (2048, 4096) for mbs in (1, 2)]


def configs_by_name(names: Iterable[str]) -> list[BenchConfig]:
    """Configurations by name (``tiny``, ``small-mbs1-seq2048``, ...); raises on an unknown one."""
    known = {c.name: c for c in full_configs()}
    out = []
    for name in names:
        if name not in known:
            raise ValueError(f"unknown bench configuration {name!r}; known: {sorted(known)}")
        out.append(known[name])
    return out
