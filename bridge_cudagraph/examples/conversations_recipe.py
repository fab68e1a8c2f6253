"""The tiny Qwen3-VL fine-tuned on conversations with several images, through Bridge's own data path, offline.

``tiny_qwen3_vl_conversations_config()`` is :func:`~bridge_cudagraph.examples.photo_recipe.tiny_qwen3_vl_photos_config`
(Bridge's Qwen3-VL SFT recipe shape: ``DirectHFSFTDatasetConfig`` with in-batch packing deferred to
``qwen3_vl_step``, Bridge's two DataLoader workers, ``NullTokenizer``, micro-batch 2) on the conversation set of
:mod:`bridge_cudagraph.examples.conversations` in place of the photo set: 1 to 6 images per sample, text-only samples
and multi-turn ones, read by Bridge's native chat schema (no schema adapter), its ``AutoProcessor``,
``qwen2_5_collate_fn`` and ``qwen3_vl_step`` unchanged, with a processor folder whose tokenizer is trained on the
set's text. ``recipes/tiny_qwen3_vl_conversations.yaml`` switches the graphs on.

Sequence 8192: the collate resizes every image to 784..3920 patches of 16x16 (196..980 tokens), so six images and
three turns of text stay under about 6,000 tokens; a sample over the sequence would be cut inside its images.
"""

from __future__ import annotations

import os

from bridge_cudagraph.examples.conversations import (
    ConversationSetSpec,
    build_conversation_set,
    conversation_texts,
)
from bridge_cudagraph.examples.photo_recipe import (
    build_set_and_processor,
    direct_sft_dataset_config,
    tiny_qwen3_vl_example_config,
)
from bridge_cudagraph.examples.processor import ProcessorFolder

__all__ = ["build_conversation_data", "conversation_dataset_config", "tiny_qwen3_vl_conversations_config"]


def build_conversation_data(root: str | os.PathLike[str] | None = None, spec: ConversationSetSpec | None = None):
    """Build (or find) the conversation set and its processor folder under ``root`` (default
    :func:`~bridge_cudagraph.examples.photo_recipe.cache_dir`).

    Returns:
        ``(conversation set folder, ProcessorFolder)``.
    """
    return build_set_and_processor(root, lambda where: build_conversation_set(where, spec), conversation_texts)


def conversation_dataset_config(
    folder: str | os.PathLike[str], processor: ProcessorFolder, seq_length: int, *, packed: bool = True
):
    """Bridge's ``DirectHFSFTDatasetConfig`` over the local conversation set: its ``messages`` rows read by Bridge's
    native chat schema (``schema_adapter`` unset), otherwise as the photo set
    (:func:`~bridge_cudagraph.examples.photo_recipe.direct_sft_dataset_config`)."""
    from megatron.bridge.data.builders import HFDatasetSourceConfig

    source = HFDatasetSourceConfig(path_or_dataset=str(folder), split="train")
    return direct_sft_dataset_config(source, processor, seq_length, packed=packed)


def tiny_qwen3_vl_conversations_config(
    *, train_iters: int = 20, seq_length: int = 8192, seed: int = 1234, cache: str | os.PathLike[str] | None = None
):
    """The tiny Qwen3-VL on the conversation set as a Bridge ``ConfigContainer`` (graphs off; the YAML turns them on).

    Args:
        train_iters: Training iterations.
        seq_length: The model's and the dataset's sequence length; every sample of the set fits in 8192.
        seed: Seed of the model initialisation (``rng.seed``); the set has its own (:class:`ConversationSetSpec`).
        cache: Where the set and the processor are built; default
            :func:`~bridge_cudagraph.examples.photo_recipe.cache_dir`.
    """
    folder, processor = build_conversation_data(cache)
    dataset = conversation_dataset_config(folder, processor, seq_length)
    return tiny_qwen3_vl_example_config(dataset, processor, train_iters=train_iters, seq_length=seq_length, seed=seed)
