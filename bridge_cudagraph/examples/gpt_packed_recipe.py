"""A tiny GPT SFT recipe on Bridge's offline packing: the pydoc set packed into rows of ``seq_length`` tokens.

``tiny_gpt_packed_config()`` is a complete Megatron-Bridge ``ConfigContainer`` whose data path is Bridge's own GPT
SFT offline packing, the path Bridge's text fine-tuning recipes take: ``GPTSFTDatasetConfig`` with
``enable_offline_packing`` over a local JSONL set (:mod:`bridge_cudagraph.examples.gpt_packed`: real documentation
texts from Python's ``pydoc_data``, a tokenizer built offline), packed by Bridge's packer at dataset build time,
loaded with ``dataloader_type="batch"`` and split into micro-batches of one row, each row handed to the model as one
THD sequence with its samples' ``cu_seqlens`` by Bridge's ``gpt_step``. With
``offline_packing_specs.pad_cu_seqlens`` (and ``pad_to_max_length``) every micro-batch has the same shapes, so
packed language graphs replay all of them (:func:`bridge_cudagraph.plan.checks.check_offline_packing`).

The model is :func:`bridge_cudagraph.examples.tiny.tiny_gpt_provider` (4 layers, RoPE) at sequence 512 with
``apply_rope_fusion=True`` (TE's fused THD rotary kernel; megatron-core's unfused one splits on the host), graphs
off here: ``recipes/tiny_gpt_packed.yaml`` switches the language graphs on. Micro-batch 1 (Bridge's rule for
offline packing), global batch 4, bf16, the distributed optimizer with overlapped reduce and gather, pure M4 groups.
"""

from __future__ import annotations

import os

from bridge_cudagraph.examples.gpt_packed import build_gpt_packed_data, gpt_packed_dataset_config
from bridge_cudagraph.examples.tiny import TINY_VOCAB, tiny_gpt_provider
from bridge_cudagraph.examples.tiny_recipe import example_config

__all__ = ["SEQ_LENGTH", "tiny_gpt_packed_config"]

#: The packed row length (and the model's ``seq_length``).
SEQ_LENGTH = 512


def tiny_gpt_packed_config(
    *,
    train_iters: int = 30,
    seed: int = 1234,
    seq_length: int = SEQ_LENGTH,
    cache: str | os.PathLike[str] | None = None,
    checkpoint_dir: str | None = None,
):
    """The tiny GPT on the offline-packed pydoc set, as a Bridge ``ConfigContainer`` (graphs off).

    Args:
        train_iters: Training iterations.
        seed: Model initialisation and packing seed.
        seq_length: Packed row length and the model's ``seq_length``.
        cache: Where the set, its tokenizer and Bridge's packed files live
            (:func:`~bridge_cudagraph.examples.photo_recipe.cache_dir` by default).
        checkpoint_dir: Where to save; default none (``checkpoint.save`` unset).
    """
    from megatron.bridge.training.config import TokenizerConfig

    data_root, tokenizer_folder, tokenizer = build_gpt_packed_data(cache, seq_length)
    if tokenizer.vocab_size > TINY_VOCAB:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens, more than the tiny GPT's {TINY_VOCAB}")
    model = tiny_gpt_provider(seq_length=seq_length, apply_rope_fusion=True)
    return example_config(
        model=model,
        dataset=gpt_packed_dataset_config(data_root, tokenizer_folder, seq_length, seed=seed),
        tokenizer=TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(tokenizer_folder)),
        micro_batch_size=1,
        global_batch_size=4,
        train_iters=train_iters,
        eval_interval=None,
        eval_iters=0,
        warmup_iters=5,
        overlap=True,
        log_interval=1,
        checkpoint_save=checkpoint_dir,
        seed=seed,
    )
