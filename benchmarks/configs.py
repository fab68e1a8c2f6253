"""The static shapes of a benchmark run: Qwen3-VL's vocabulary and special ids, and :class:`BenchConfig`."""

from __future__ import annotations

from dataclasses import dataclass

#: Qwen3-VL's vocabulary and special token ids (HF ``Qwen/Qwen3-VL-2B-Instruct`` config).
QWEN3_VL_VOCAB = 151936
QWEN3_VL_TOKENS = {
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}
#: Qwen3-VL's spatial merge (2 x 2 patches per language token).
MERGE = 2


@dataclass(frozen=True)
class BenchConfig:
    """One run's configuration: a model, static shapes and the micro-batches cycled through."""

    name: str
    model: str
    """The ``--model`` of :mod:`benchmarks.useful_tokens`."""
    seq_length: int
    micro_batch_size: int
    image_sets: tuple
    """One entry per distinct micro-batch: per sample, a tuple of image grids ``(t, h, w)`` in patches."""
    num_microbatches: int = 1

    def patches_per_microbatch(self) -> list[int]:
        """Vision patches of each distinct micro-batch."""
        return [sum(t * h * w for sample in mb for (t, h, w) in sample) for mb in self.image_sets]

    def frames_per_microbatch(self) -> list[int]:
        """Attention segments (image frames) of each distinct micro-batch."""
        return [sum(t for sample in mb for (t, _, _) in sample) for mb in self.image_sets]

    def vision_budgets(self) -> list[int]:
        """Ours: the plugin's vision ladder from the data's largest micro-batch down to the language floor."""
        from bridge_cudagraph.plan.budgets import LANGUAGE_LADDER_FLOOR, geometric_ladder, vision_ladder_multiple

        top = max([*self.patches_per_microbatch(), MERGE * MERGE])
        return geometric_ladder(top, vision_ladder_multiple(MERGE), LANGUAGE_LADDER_FLOOR)

    def vision_max_segments(self) -> int:
        """Ours: the static ``cu_seqlens`` length (the plugin's default, or more if the data has more frames)."""
        from bridge_cudagraph.plan.budgets import derive_max_segments

        return max(derive_max_segments(self.vision_budgets(), MERGE), *self.frames_per_microbatch())

    def upstream_vision_seq_length(self) -> int:
        """Upstream: one ``max_vision_cuda_graph_seq_length``, our ladder's top."""
        return self.vision_budgets()[-1]
