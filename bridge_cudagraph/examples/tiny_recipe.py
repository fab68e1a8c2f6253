"""A self-contained tiny Qwen3-VL recipe: random weights, synthetic image-text data, no downloads, no files.

``tiny_qwen3_vl_config()`` returns a complete Megatron-Bridge ``ConfigContainer`` built from
``megatron.bridge.training.config`` alone (``megatron.bridge.recipes`` is deliberately not imported: it needs
``diffusers``, which the GPU machine lacks). It is what ``recipes/tiny_qwen3_vl.yaml`` names, what the Bridge-loop
GPU test trains, and the smallest thing to try the plugin on:

* the model is :func:`bridge_cudagraph.examples.tiny.tiny_qwen3_vl_provider` (4+4 layers, mRoPE, deepstack),
  graphs off here; the YAML switches ``model.cuda_graph.language`` / ``.vision`` on;
* ``dist.use_decentralized_pg=True``: Bridge builds its process groups from ``HyperCommGrid`` and never
  initialises ``parallel_state`` (M4);
* bf16, distributed optimizer with overlapped gradient reduce and parameter gather (so the DDP forward
  pre-hooks and the graphs' manual hooks are exercised), sequence 256, micro-batch 2, global batch 2,
  50 iterations, evaluation every 20 iterations for 2, logging every 10, a checkpoint at the end;
* ``train.exit_signal_handler=True``: SIGTERM (Slurm's ``scancel``, preemption, torchrun passing its own SIGTERM on)
  ends training at the next step boundary: a checkpoint when ``checkpoint.save`` is set, the graphs deleted, exit
  code 0 (see :mod:`bridge_cudagraph.bridge.train`). Bridge's default, off, lets SIGTERM kill the process outright;
* the data is :class:`TinyVLMDatasetConfig`: a Bridge ``DatasetProvider`` that makes every sample in-process
  from a seed, with one to three images of different sizes, in exactly the batch layout Bridge's
  ``qwen3_vl_step.forward_step`` reads (see :meth:`TinyVLMDataset.collate_fn`).

Graphs need static shapes, so every sample is exactly ``seq_length`` tokens and nothing is packed.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

import torch
from megatron.bridge.data.base import DatasetBuildContext, DatasetProvider

from bridge_cudagraph.examples.data import patches_of, qwen3_vl_batch
from bridge_cudagraph.examples.tiny import TINY_VOCAB, tiny_qwen3_vl_provider

#: Environment variable naming the checkpoint directory when the recipe is not given one.
CHECKPOINT_DIR_ENV = "BRIDGE_CUDAGRAPH_CKPT_DIR"

#: Image grids ``(t, h, w)`` in patches: 16 to 144 patches (4 to 36 image tokens after the 2x2 merge).
DEFAULT_IMAGE_GRIDS = ((1, 8, 8), (1, 8, 12), (1, 16, 8), (1, 4, 4), (1, 12, 12))

_SPLITS = ("train", "valid", "test")
# examples.data.qwen3_vl_batch puts up to 7 text tokens before each image and the two vision delimiters around it.
_TOKENS_AROUND_IMAGE = 7 + 2


@dataclass(kw_only=True)
class TinyVLMDatasetConfig(DatasetProvider):
    """Synthetic Qwen3-VL image-text samples made in-process (Bridge ``DatasetProvider``).

    Sample ``i`` of a split is a pure function of ``(seed, split, i)``, so a resumed run sees exactly the batches
    an uninterrupted run sees after the same number of consumed samples.
    """

    seq_length: int = 256
    """Tokens per sample; every sample is exactly this long (static shapes for graphs)."""

    image_grids: list[list[int]] = field(default_factory=lambda: [list(g) for g in DEFAULT_IMAGE_GRIDS])
    """Image sizes to draw from, as ``[t, h, w]`` in patches (``h`` and ``w`` multiples of the merge size)."""

    max_images_per_sample: int = 3
    """Each sample holds between one and this many images."""

    seed: int = 1234
    """Seed of the synthetic data."""

    patch_dim: int = 3 * 2 * 16 * 16
    """Values per patch: ``in_channels * temporal_patch_size * patch_size**2`` of the vision encoder."""

    spatial_merge_size: int = 2
    """The vision encoder's merge size: ``merge**2`` patches become one image token."""

    dataloader_type: str | None = "single"
    """Sequential sampling from the consumed-sample count: resume continues exactly where a run stopped."""

    num_workers: int = 0
    """Samples are cheap to make; no worker processes."""

    pad_to_max_length: bool = True
    """Always true: every sample fills ``seq_length``; read by Bridge's config validation."""

    enable_in_batch_packing: bool = False
    """Always false: graphs cannot replay packed (THD) micro-batches; read by ``qwen3_vl_step``."""

    skip_getting_attention_mask_from_dataset: bool = True
    """The step builds no attention mask from the batch (causal attention); read by ``qwen3_vl_step``."""

    def validate(self) -> None:
        """Raise ``ValueError`` when the settings cannot make a sample."""
        if not self.image_grids or self.max_images_per_sample < 1:
            raise ValueError("TinyVLMDatasetConfig needs at least one image grid and max_images_per_sample >= 1")
        merge = self.spatial_merge_size
        for grid in self.image_grids:
            if len(grid) != 3 or min(grid) < 1 or grid[1] % merge or grid[2] % merge:
                raise ValueError(
                    f"dataset.image_grids entry {grid} must be [t, h, w] with h and w multiples of {merge}"
                )
        worst = self.max_images_per_sample * (
            _TOKENS_AROUND_IMAGE + max(patches_of(g) for g in self.image_grids) // merge**2
        )
        if worst + 1 > self.seq_length:
            raise ValueError(
                f"dataset: {self.max_images_per_sample} of the largest image need {worst} tokens, more than "
                f"seq_length {self.seq_length}; lower max_images_per_sample or use smaller image_grids"
            )
        if not self.pad_to_max_length or self.enable_in_batch_packing:
            raise ValueError(
                "TinyVLMDatasetConfig always pads to seq_length and never packs (graphs need static shapes); "
                "leave pad_to_max_length=true and enable_in_batch_packing=false"
            )

    def finalize(self) -> None:
        """Bridge's ``ConfigContainer.validate`` calls this; validate on top of the dataloader defaults."""
        super().finalize()
        self.validate()

    def build_datasets(self, context: DatasetBuildContext) -> tuple[Any, Any, Any]:
        """Train, validation and test splits of the sizes Bridge asks for (``None`` for an empty one)."""
        sizes = (context.train_samples, context.valid_samples, context.test_samples)
        train, valid, test = (
            TinyVLMDataset(self, split, size) if size > 0 else None for split, size in zip(_SPLITS, sizes, strict=True)
        )
        return train, valid, test


class TinyVLMDataset(torch.utils.data.Dataset):
    """One split of :class:`TinyVLMDatasetConfig`.

    Twice the requested length, so a sequential sampler never runs dry (Bridge's validation iterator is a single
    pass that evaluations share); any index can be made.
    """

    def __init__(self, config: TinyVLMDatasetConfig, split: str, requested: int) -> None:
        self.config = config
        self.split = split
        self.length = 2 * requested

    def __len__(self) -> int:
        return self.length

    def sample_seed(self, index: int) -> int:
        """The seed of sample ``index``: stable across processes and Python hash seeds."""
        key = f"{self.config.seed}/{self.split}/{index}".encode()
        return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & (2**62 - 1)

    def image_grids_of(self, index: int) -> list[tuple[int, int, int]]:
        """The images of sample ``index``: one to ``max_images_per_sample``, sizes drawn from ``image_grids``."""
        g = torch.Generator().manual_seed(self.sample_seed(index))
        count = int(torch.randint(1, self.config.max_images_per_sample + 1, (1,), generator=g))
        picks = torch.randint(0, len(self.config.image_grids), (count,), generator=g).tolist()
        return [tuple(self.config.image_grids[p]) for p in picks]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        cfg = self.config
        row = qwen3_vl_batch(
            [self.image_grids_of(index)],
            cfg.seq_length,
            seed=self.sample_seed(index),
            patch_dim=cfg.patch_dim,
            merge=cfg.spatial_merge_size,
            device="cpu",
        )
        return {
            "input_ids": row["input_ids"][0],
            "labels": row["labels"][0],
            "loss_mask": row["loss_mask"][0],
            "position_ids": torch.arange(cfg.seq_length),
            "pixel_values": row["pixel_values"],
            "image_grid_thw": row["image_grid_thw"],
        }

    @staticmethod
    def collate_fn(samples: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
        """A micro-batch as Bridge's Qwen-VL collate lays it out and ``qwen3_vl_step.get_batch`` reads it.

        ``input_ids``/``labels``/``loss_mask``/``position_ids`` are ``[b, seq_length]``; the images travel in one
        ``GenericVisualInputs`` (``pixel_values [patches, patch_dim]``, ``image_grid_thw [images, 3]``), which the
        step moves to the GPU and flattens with ``normalized_for_model()``. There are no ``cu_seqlens`` keys
        (the step refuses collate-time packing) and no attention mask (the step would drop it).
        """
        from megatron.bridge.training.utils.visual_inputs import GenericVisualInputs

        pixels = [s["pixel_values"] for s in samples if s["pixel_values"] is not None]
        grids = [s["image_grid_thw"] for s in samples if s["image_grid_thw"] is not None]
        batch: dict[str, Any] = {
            key: torch.stack([s[key] for s in samples]) for key in ("input_ids", "labels", "loss_mask", "position_ids")
        }
        batch["visual_inputs"] = GenericVisualInputs(
            pixel_values=torch.cat(pixels) if pixels else None,
            image_grid_thw=torch.cat(grids) if grids else None,
        )
        return batch


def default_checkpoint_dir() -> str:
    """``$BRIDGE_CUDAGRAPH_CKPT_DIR``, else one fixed directory under the system temp dir.

    Fixed (not ``mkdtemp``) because every rank of a run must name the same directory.
    """
    return os.environ.get(CHECKPOINT_DIR_ENV) or os.path.join(tempfile.gettempdir(), "bridge_cudagraph_tiny_qwen3_vl")


def tiny_qwen3_vl_config(*, checkpoint_dir: str | None = None, train_iters: int = 50, seed: int = 1234):
    """The tiny Qwen3-VL recipe as a Bridge ``ConfigContainer`` (graphs off; the YAML turns them on).

    Args:
        checkpoint_dir: Where checkpoints are saved; default :func:`default_checkpoint_dir`. Nothing is loaded
            unless ``checkpoint.load`` is set (so a leftover directory is overwritten, never resumed).
        train_iters: Training iterations.
        seed: Seed of the model initialisation (``rng.seed``) and of the synthetic data.
    """
    from megatron.bridge.training.config import TokenizerConfig

    model = tiny_qwen3_vl_provider()
    vision = model.vision_config
    return example_config(
        model=model,
        dataset=TinyVLMDatasetConfig(
            seq_length=model.seq_length,
            seed=seed,
            patch_dim=vision.in_channels * vision.temporal_patch_size * vision.patch_size**2,
            spatial_merge_size=vision.spatial_merge_size,
        ),
        # Bridge builds a tokenizer even when the data is made of ids; the null tokenizer needs no files.
        tokenizer=TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=TINY_VOCAB),
        micro_batch_size=2,
        global_batch_size=2,
        train_iters=train_iters,
        eval_interval=20,
        eval_iters=2,
        warmup_iters=5,
        overlap=True,
        log_interval=10,
        checkpoint_save=checkpoint_dir or default_checkpoint_dir(),
        seed=seed,
    )


def example_config(
    *,
    model: Any,
    dataset: Any,
    tokenizer: Any,
    micro_batch_size: int,
    global_batch_size: int,
    train_iters: int,
    eval_interval: int | None,
    eval_iters: int,
    warmup_iters: int,
    overlap: bool,
    log_interval: int,
    checkpoint_save: str | None,
    seed: int,
    average_in_collective: bool = False,
):
    """The ``ConfigContainer`` every example recipe shares around its own model, data and tokenizer.

    * ``train.exit_signal_handler=True``: SIGTERM finishes the step, saves (when ``checkpoint_save`` is set),
      deletes the graphs and exits 0, instead of dying mid-step;
    * :func:`adam_with_cosine`; the distributed optimizer with fp32 gradient reduce, with the gradient-reduce and
      parameter-gather overlap on or off (``overlap``: Bridge's VLM recipes have it off), NaN checks on;
    * pure M4 groups (``dist.use_decentralized_pg=True``: Bridge builds them from ``HyperCommGrid`` and never
      initialises ``parallel_state``), bf16, ``torch_dist`` checkpoints without tokenizer assets, nothing loaded.
    """
    from megatron.bridge.training.config import (
        CheckpointConfig,
        ConfigContainer,
        DistributedDataParallelConfig,
        DistributedInitConfig,
        LoggerConfig,
        RNGConfig,
        TrainingConfig,
        ValidationConfig,
    )

    ddp = dict(
        use_distributed_optimizer=True,
        overlap_grad_reduce=overlap,
        overlap_param_gather=overlap,
        grad_reduce_in_fp32=True,
        check_for_nan_in_grad=True,
    )
    if average_in_collective:
        ddp["average_in_collective"] = True
    return ConfigContainer(
        model=model,
        train=TrainingConfig(
            micro_batch_size=micro_batch_size,
            global_batch_size=global_batch_size,
            train_iters=train_iters,
            exit_signal_handler=True,
        ),
        validation=ValidationConfig(eval_interval=eval_interval, eval_iters=eval_iters),
        **adam_with_cosine(warmup_iters=warmup_iters, overlap_param_gather=overlap),
        ddp=DistributedDataParallelConfig(**ddp),
        dataset=dataset,
        logger=LoggerConfig(log_interval=log_interval),
        tokenizer=tokenizer,
        checkpoint=CheckpointConfig(
            save=checkpoint_save, load=None, ckpt_format="torch_dist", save_tokenizer_assets=False
        ),
        dist=DistributedInitConfig(use_decentralized_pg=True, use_gloo_process_groups=False),
        rng=RNGConfig(seed=seed),
        mixed_precision="bf16_mixed",
    )


def adam_with_cosine(*, warmup_iters: int, overlap_param_gather: bool) -> dict:
    """The ``optimizer`` and ``scheduler`` of the example recipes: distributed Adam in bf16, lr 3e-4 to 3e-5 on a
    cosine, weight decay 0.01 (Bridge's fine-tuning defaults at a tiny model's learning rate)."""
    from megatron.bridge.training.config import OptimizerConfig, SchedulerConfig

    return {
        "optimizer": OptimizerConfig(
            optimizer="adam",
            lr=3e-4,
            min_lr=3e-5,
            weight_decay=0.01,
            adam_beta1=0.9,
            adam_beta2=0.95,
            clip_grad=1.0,
            bf16=True,
            use_distributed_optimizer=True,
            overlap_param_gather=overlap_param_gather,
        ),
        # Megatron's OptimizerParamScheduler asserts start_wd >= 0: the weight-decay schedule must be explicit.
        "scheduler": SchedulerConfig(
            lr_decay_style="cosine",
            lr_warmup_iters=warmup_iters,
            start_weight_decay=0.01,
            end_weight_decay=0.01,
            weight_decay_incr_style="constant",
        ),
    }
