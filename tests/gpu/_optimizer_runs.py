"""The tiny models and the 30 steps of data both optimizer GPU tests train (``test_optimizer_graph.py``,
``test_optimizer_host_step.py``): a GPT and a Qwen3-VL, language graphs on and, for Qwen3-VL, vision graphs with
three budgets; micro-batches cycling through no images, one, and five over two samples."""

from __future__ import annotations

from bridge_cudagraph.examples.data import IMAGE_MIXES

SEQ = 256
MBS = 2
STEPS = 30
IMAGE_SETS = list(IMAGE_MIXES.values())  # cycled, in this order


def provider(kind: str, graphs: bool = True):
    """A tiny ``gpt`` or ``qwen3_vl`` provider, with our graphs (``graphs``) or without."""
    from bridge_cudagraph.config import CudaGraphConfig, LanguageGraphConfig, VisionGraphConfig
    from bridge_cudagraph.examples import tiny

    if kind == "gpt":
        cfg = CudaGraphConfig(language=LanguageGraphConfig(enabled=True)) if graphs else None
        return tiny.tiny_gpt_provider(cfg)
    cfg = None
    if graphs:
        cfg = CudaGraphConfig(
            language=LanguageGraphConfig(enabled=True),
            vision=VisionGraphConfig(enabled=True, token_budgets=[256, 512, 1024], max_images_per_microbatch=8),
        )
    return tiny.tiny_qwen3_vl_provider(cfg)


def steps(kind: str) -> list[list[dict]]:
    """``STEPS`` steps of one micro-batch each, the same on every call."""
    from bridge_cudagraph.examples.data import gpt_batch, qwen3_vl_batch

    if kind == "gpt":
        return [[gpt_batch(MBS, SEQ, seed=100 + i)] for i in range(STEPS)]
    return [[qwen3_vl_batch(IMAGE_SETS[i % len(IMAGE_SETS)], SEQ, seed=100 + i)] for i in range(STEPS)]
