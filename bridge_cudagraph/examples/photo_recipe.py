"""The tiny Qwen3-VL fine-tuned on real photographs through Bridge's own data path, offline.

``tiny_qwen3_vl_photos_config()`` is Bridge's Qwen3-VL SFT recipe shape (``_sft_common_vlm`` and
``qwen3_vl_8b_*_config`` in ``megatron.bridge.recipes``, rebuilt here from ``megatron.bridge.training.config``
because importing ``megatron.bridge.recipes`` needs ``diffusers``) on the tiny model:

* data: ``DirectHFSFTDatasetConfig`` with ``enable_in_batch_packing=True`` and
  ``defer_in_batch_packing_to_step=True``, as Bridge's Qwen3-VL recipes set; its source is the local photo set of
  :mod:`bridge_cudagraph.examples.photos` in CORD-v2's schema (``schema_adapter="cord_v2"``, the adapter of
  Bridge's ``cord_v2`` preset), and ``hf_processor_path`` the folder of
  :mod:`bridge_cudagraph.examples.processor`; so Bridge's source loader, schema adapter, ``AutoProcessor``,
  ``qwen2_5_collate_fn`` and ``qwen3_vl_step`` all run unchanged;
* ``NullTokenizer``, as Bridge's VLM recipes (the processor tokenizes);
* the tiny Qwen3-VL (:func:`~bridge_cudagraph.examples.tiny.tiny_qwen3_vl_provider`) at sequence 2048, with the
  processor's token ids, graphs off here (``recipes/tiny_qwen3_vl_photos.yaml`` switches them on);
* micro-batch 2 (Bridge refuses in-batch packing at micro-batch 1), global batch 2, 20 iterations, evaluation
  every 10 for 2, no checkpoint loaded or saved (``checkpoint.save=...`` to save).

``tiny_qwen3_vl_moe_photos_config()`` is the same with the MoE tiny Qwen3-VL, packed the same way
(``recipes/tiny_qwen3_vl_moe_photos.yaml``); ``packed=False`` pads its rows instead.

Both folders are built when the function runs, under ``$BRIDGE_CUDAGRAPH_CACHE`` (default: a fixed folder in the
system temp dir), each named by a hash of its content and reused when present: every rank builds the same
bytes, and a second run builds nothing. Needs scikit-image, ``datasets`` and ``qwen_vl_utils`` (Bridge's Qwen-VL
collate imports it), and no network: ``HF_DATASETS_OFFLINE`` is set to 1.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bridge_cudagraph.examples.photos import PROMPT, PhotoSetSpec, answer_texts, build_photo_set
from bridge_cudagraph.examples.processor import ProcessorFolder, build_processor_folder, content_key
from bridge_cudagraph.examples.tiny import TINY_VOCAB, tiny_qwen3_vl_provider
from bridge_cudagraph.examples.tiny_recipe import example_config

__all__ = [
    "CACHE_ENV",
    "build_photo_data",
    "build_set_and_processor",
    "cache_dir",
    "direct_sft_dataset_config",
    "photo_dataset_config",
    "tiny_qwen3_vl_example_config",
    "tiny_qwen3_vl_moe_photos_config",
    "tiny_qwen3_vl_photos_config",
]

#: Environment variable naming the folder the photo set and the processor are built into.
CACHE_ENV = "BRIDGE_CUDAGRAPH_CACHE"


def cache_dir() -> Path:
    """``$BRIDGE_CUDAGRAPH_CACHE``, else one fixed folder under the system temp dir (every rank names the same),
    created; a folder this user cannot create or write is refused in one line naming the variable."""
    from bridge_cudagraph.recipe import RecipeError

    given = os.environ.get(CACHE_ENV)
    root = Path(given) if given else Path(tempfile.gettempdir()) / "bridge_cudagraph_cache"
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=root):
            pass
    except OSError as error:
        where = f"{CACHE_ENV}={given}" if given else f"the example cache {root} (the default: {CACHE_ENV} is unset)"
        raise RecipeError(
            f"{where} cannot be written ({error.strerror or type(error).__name__}); set {CACHE_ENV} to a folder "
            "this user can write"
        ) from error
    return root


def build_photo_data(root: str | os.PathLike[str] | None = None, spec: PhotoSetSpec | None = None):
    """Build (or find) the photo set and its processor folder under ``root``.

    Returns:
        ``(photo set folder, ProcessorFolder)``.
    """
    return build_set_and_processor(root, lambda where: build_photo_set(where, spec), answer_texts)


def build_set_and_processor(
    root: str | os.PathLike[str] | None, build: Callable[[Path], Path], texts_of: Callable[[Path], Any]
) -> tuple[Path, ProcessorFolder]:
    """An example set built (or found) under ``root`` (default :func:`cache_dir`) by ``build(root)``, and the
    processor folder whose tokenizer covers its texts (``texts_of(set folder)``), named by their content."""
    root = Path(root) if root is not None else cache_dir()
    folder = build(root)
    texts = texts_of(folder)
    return folder, build_processor_folder(root / f"processor-{content_key(texts)}", texts)


def photo_dataset_config(
    photos: str | os.PathLike[str], processor: ProcessorFolder, seq_length: int, *, packed: bool = True
):
    """Bridge's ``DirectHFSFTDatasetConfig`` over the local photo set, read with Bridge's ``cord_v2`` schema adapter
    (:func:`direct_sft_dataset_config`)."""
    from megatron.bridge.data.builders import HFDatasetSourceConfig

    source = HFDatasetSourceConfig(
        path_or_dataset=str(photos), split="train", schema_adapter="cord_v2", adapter_kwargs={"prompt": PROMPT}
    )
    return direct_sft_dataset_config(source, processor, seq_length, packed=packed)


def direct_sft_dataset_config(source, processor: ProcessorFolder, seq_length: int, *, packed: bool = True):
    """Bridge's ``DirectHFSFTDatasetConfig`` over ``source`` (an ``HFDatasetSourceConfig`` of a local set), as Bridge's
    Qwen3-VL recipes configure it (``packed``: in-batch packing deferred to the step); ``packed=False`` pads every row
    to ``seq_length`` instead, Bridge's data path without packing."""
    from megatron.bridge.data.builders import ChatSFTPreprocessingConfig, DirectHFSFTDatasetConfig

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    return DirectHFSFTDatasetConfig(
        seq_length=seq_length,
        preprocessing=ChatSFTPreprocessingConfig(),
        hf_processor_path=str(processor.path),
        source=source,
        # Bridge's Qwen3-VL recipes' two workers; they deliver under bridge_cudagraph.host.data_workers (the fast
        # tokenizer in forked workers waits forever without it).
        num_workers=2,
        dataloader_type="cyclic",
        data_sharding=True,
        pin_memory=True,
        persistent_workers=False,
        enable_in_batch_packing=packed,
        defer_in_batch_packing_to_step=packed,
        pad_to_max_length=not packed,
    )


def tiny_qwen3_vl_photos_config(
    *, train_iters: int = 20, seq_length: int = 2048, seed: int = 1234, cache: str | os.PathLike[str] | None = None
):
    """The tiny Qwen3-VL on the photo set as a Bridge ``ConfigContainer`` (graphs off; the YAML turns them on).

    Args:
        train_iters: Training iterations.
        seq_length: The model's and the dataset's sequence length; every sample of the set fits in 2048.
        seed: Seed of the model initialisation (``rng.seed``); the photo set has its own (:class:`PhotoSetSpec`).
        cache: Where the photo set and the processor are built; default :func:`cache_dir`.
    """
    return _photos_config(moe=False, train_iters=train_iters, seq_length=seq_length, seed=seed, cache=cache)


def tiny_qwen3_vl_moe_photos_config(
    *,
    train_iters: int = 20,
    seq_length: int = 2048,
    seed: int = 1234,
    cache: str | os.PathLike[str] | None = None,
    packed: bool = True,
):
    """:func:`tiny_qwen3_vl_photos_config` with the MoE tiny Qwen3-VL (4 experts, top 2, the alltoall dispatcher,
    aux-loss balancing) on Bridge's Qwen3-VL packing (``recipes/tiny_qwen3_vl_moe_photos.yaml``), whose packed
    language graphs hold each MoE layer's attention, the rest of the layer eager on the micro-batch's own tokens;
    ``packed=False`` pads every row to ``seq_length`` instead (the same attention graphs on the padded ladder, the MoE
    half on every row). Pure M4 like every example, so Bridge logs its MoE metrics on its decentralized collection."""
    return _photos_config(
        moe=True, train_iters=train_iters, seq_length=seq_length, seed=seed, cache=cache, packed=packed
    )


def _photos_config(
    *,
    moe: bool,
    train_iters: int,
    seq_length: int,
    seed: int,
    cache: str | os.PathLike[str] | None,
    packed: bool = True,
):
    photos, processor = build_photo_data(cache)
    dataset = photo_dataset_config(photos, processor, seq_length, packed=packed)
    return tiny_qwen3_vl_example_config(
        dataset, processor, moe=moe, train_iters=train_iters, seq_length=seq_length, seed=seed
    )


def tiny_qwen3_vl_example_config(
    dataset, processor: ProcessorFolder, *, moe: bool = False, train_iters: int, seq_length: int, seed: int
):
    """The tiny Qwen3-VL (dense, or MoE with ``moe``) built with ``processor``'s token ids, on ``dataset`` (a Bridge
    dataset config whose processor that is), as a ``ConfigContainer`` in the shape of Bridge's Qwen3-VL SFT recipes
    (the module docstring lists it); graphs off."""
    from megatron.bridge.training.config import TokenizerConfig

    if processor.vocab_size > TINY_VOCAB:
        raise ValueError(f"the processor has {processor.vocab_size} tokens, more than the tiny model's {TINY_VOCAB}")
    model = tiny_qwen3_vl_provider(
        moe=moe,
        seq_length=seq_length,
        language_max_sequence_length=seq_length,
        image_token_id=processor.image_token_id,
        video_token_id=processor.video_token_id,
        vision_start_token_id=processor.vision_start_token_id,
        vision_end_token_id=processor.vision_end_token_id,
    )
    return example_config(
        model=model,
        dataset=dataset,
        tokenizer=TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=TINY_VOCAB),
        micro_batch_size=2,
        global_batch_size=2,
        train_iters=train_iters,
        eval_interval=10,
        eval_iters=2,
        warmup_iters=2,
        overlap=False,  # Bridge's VLM recipes: no gradient-reduce or parameter-gather overlap
        average_in_collective=True,
        log_interval=1,
        checkpoint_save=None,
        seed=seed,
    )
