"""Bridge's Qwen3-VL 8B LoRA recipe on one GPU, offline, with random weights, on the photo set.

``qwen3_vl_8b_peft_photos_config()`` calls Megatron-Bridge's own ``qwen3_vl_8b_peft_1gpu_h100_bf16_config()``
(``megatron/bridge/recipes/qwen_vl/h100/qwen3_vl.py``; imported without running ``megatron.bridge.recipes``'s
``__init__``, which needs ``diffusers``: :func:`~bridge_cudagraph.host.bridge_recipes.bridge_recipes_without_init`) and
changes only what running it offline on random weights forces:

* **data**: Bridge's ``DirectHFSFTDatasetConfig`` over the local photo set and the offline-built Qwen3-VL processor
  folder (:func:`~bridge_cudagraph.examples.photo_recipe.photo_dataset_config`, the photo recipe's data path), in
  place of CORD-v2 from the Hub and Qwen's processor from the Hub. The same settings otherwise (sequence 4096,
  ``enable_in_batch_packing`` and ``defer_in_batch_packing_to_step``, so Bridge's ``qwen2_5_collate_fn`` and
  ``qwen3_vl_step`` pack in the batch as the recipe does, with its two DataLoader workers);
* **token ids**: the provider's ``image_token_id``, ``video_token_id``, ``vision_start_token_id`` and
  ``vision_end_token_id`` are the processor folder's (1000-1003, where Qwen's are 151652-151656); its 1020 tokens
  fit in the 8B embedding table (``vocab_size`` 151936), so every id the collate makes has a row;
* **base checkpoint**: Bridge's PEFT needs one (see :mod:`~bridge_cudagraph.examples.random_base`);
  ``checkpoint.pretrained_checkpoint`` is :func:`random_base_dir`, which
  ``python -m bridge_cudagraph.examples.random_base RECIPE.yaml`` fills once, on a GPU, with random weights through
  Bridge's own save path. ``validate`` and ``plan`` do not need it to exist; ``train`` does.

Everything else is Bridge's: the model (``AutoBridge.from_hf_pretrained("Qwen/Qwen3-VL-8B-Instruct")``, answered
offline by ``recipes/hf_configs``), LoRA (dim 32, alpha 32, ``linear_qkv``, ``linear_proj``, ``linear_fc1``,
``linear_fc2``), TP 1, sequence 4096, micro-batch 2, global batch 32, 300000 iterations, Adam at 1e-4 with 500
warm-up iterations, the DDP and precision settings, seed 1234, the environment variables. The model's graph
block is left off here; ``recipes/qwen3_vl_8b_peft_photos_graphs.yaml`` switches it on.
"""

from __future__ import annotations

import os
from pathlib import Path

from bridge_cudagraph.examples.photo_recipe import build_photo_data, cache_dir, photo_dataset_config

__all__ = ["BRIDGE_RECIPE", "HF_MODEL_ID", "qwen3_vl_8b_peft_photos_config", "random_base_dir"]

#: The Bridge recipe function this one starts from.
BRIDGE_RECIPE = "megatron.bridge.recipes.qwen_vl.h100.qwen3_vl:qwen3_vl_8b_peft_1gpu_h100_bf16_config"

#: The model Bridge's recipe loads.
HF_MODEL_ID = "Qwen/Qwen3-VL-8B-Instruct"


def random_base_dir(seed: int, root: str | os.PathLike[str] | None = None) -> Path:
    """Where the random base checkpoint of Qwen3-VL 8B with ``seed`` lives: ``<cache>/base-<model>-random-<seed>``.

    ``root`` defaults to :func:`~bridge_cudagraph.examples.photo_recipe.cache_dir` (``$BRIDGE_CUDAGRAPH_CACHE``).
    """
    root = Path(root) if root is not None else cache_dir()
    return root / f"base-{HF_MODEL_ID.replace('/', '--')}-random-{seed}"


def qwen3_vl_8b_peft_photos_config(*, cache: str | os.PathLike[str] | None = None):
    """Bridge's ``qwen3_vl_8b_peft_1gpu_h100_bf16_config()`` on the photo set, random base weights, offline.

    Args:
        cache: Where the photo set, the processor folder and the base checkpoint live; default
            :func:`~bridge_cudagraph.examples.photo_recipe.cache_dir`.

    Raises:
        ValueError: The processor's vocabulary does not fit the model's embedding table.
    """
    from bridge_cudagraph.host.bridge_recipes import bridge_recipes_without_init

    with bridge_recipes_without_init():
        from megatron.bridge.recipes.qwen_vl.h100.qwen3_vl import qwen3_vl_8b_peft_1gpu_h100_bf16_config

        cfg = qwen3_vl_8b_peft_1gpu_h100_bf16_config()
    photos, processor = build_photo_data(cache)
    model = cfg.model
    if processor.vocab_size > model.vocab_size:
        raise ValueError(
            f"the processor has {processor.vocab_size} tokens, more than the model's vocab_size {model.vocab_size}"
        )
    model.image_token_id = processor.image_token_id
    model.video_token_id = processor.video_token_id
    model.vision_start_token_id = processor.vision_start_token_id
    model.vision_end_token_id = processor.vision_end_token_id
    cfg.dataset = photo_dataset_config(photos, processor, cfg.dataset.seq_length)
    cfg.checkpoint.pretrained_checkpoint = str(random_base_dir(cfg.rng.seed, cache))
    return cfg
