"""The tiny Qwen3-VL recipe on CPU: Bridge's own config validation, its YAML, and the synthetic batches read the
way Bridge's data loader and ``qwen3_vl_step`` read them."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from bridge_cudagraph.examples.tiny import IMAGE_TOKEN_ID, VIDEO_TOKEN_ID, VISION_START_TOKEN_ID
from bridge_cudagraph.examples.tiny_recipe import TinyVLMDatasetConfig, tiny_qwen3_vl_config

ROOT = Path(__file__).resolve().parents[3]
YAML = ROOT / "recipes" / "tiny_qwen3_vl.yaml"
BATCH_KEYS = {"input_ids", "labels", "loss_mask", "position_ids", "visual_inputs"}


def _validated(tmp_path):
    from megatron.bridge.training.config import runtime_config_update

    cfg = tiny_qwen3_vl_config(checkpoint_dir=str(tmp_path / "ckpt"))
    runtime_config_update(cfg)  # what pretrain() runs first: mixed precision, then ConfigContainer.validate()
    return cfg


def test_config_validates_as_the_brief_says(tmp_path):
    cfg = _validated(tmp_path)
    assert cfg.dist.use_decentralized_pg and not cfg.dist.use_gloo_process_groups
    assert cfg.model.bf16 and cfg.model.params_dtype is torch.bfloat16 and cfg.optimizer.bf16
    assert cfg.optimizer.use_distributed_optimizer and cfg.ddp.use_distributed_optimizer
    assert cfg.ddp.overlap_param_gather and cfg.ddp.overlap_grad_reduce
    assert (cfg.model.seq_length, cfg.train.micro_batch_size, cfg.train.global_batch_size) == (256, 2, 2)
    assert cfg.train.train_iters == 50 and cfg.logger.log_interval == 10
    # SIGTERM ends training at a step boundary (checkpoint, graphs deleted, exit 0) instead of killing it mid-step.
    assert cfg.train.exit_signal_handler and cfg.train.exit_signal == signal.SIGTERM
    assert (cfg.validation.eval_interval, cfg.validation.eval_iters) == (20, 2)
    assert cfg.checkpoint.save == str(tmp_path / "ckpt") and cfg.checkpoint.load is None
    assert cfg.tokenizer.tokenizer_type == "NullTokenizer" and cfg.tokenizer.vocab_size == cfg.model.vocab_size
    assert cfg.model.cuda_graph_impl == "none" and not cfg.model.cuda_graph.any_enabled
    assert cfg.dataset.seq_length == cfg.model.seq_length and cfg.dataset.pad_to_max_length


def test_yaml_loads_with_both_submodules_on_and_bridge_validation_accepts_it():
    from megatron.bridge.training.config import runtime_config_update

    from bridge_cudagraph.recipe.load import load_recipe

    data = yaml.safe_load(YAML.read_text())
    assert data["recipe"] == "bridge_cudagraph.examples.tiny_recipe:tiny_qwen3_vl_config" and data["world_size"] == 1
    loaded = load_recipe(YAML, ["checkpoint.save=null"])  # what `bridge-cudagraph train` does first
    cfg = loaded.config
    runtime_config_update(cfg)
    assert cfg.model.cuda_graph.language.enabled and cfg.model.cuda_graph.vision.enabled
    assert cfg.model.cuda_graph_impl == "transformer_engine" and cfg.model.vision_cuda_graph_impl == "none"
    assert cfg.model.use_te_rng_tracker and cfg.rng.te_rng_tracker
    assert not cfg.dataset.enable_in_batch_packing and cfg.dataset.pad_to_max_length
    assert isinstance(cfg.dataset, TinyVLMDatasetConfig) and cfg.checkpoint.save is None
    assert cfg.train.exit_signal_handler


def test_the_teardown_runs_settings_validate():
    """What tests/gpu/test_teardown.py's runs override: 10 iterations, no evaluation at all, SIGTERM handled."""
    from megatron.bridge.data.loaders import get_train_valid_test_num_samples
    from megatron.bridge.training.config import runtime_config_update

    from bridge_cudagraph.recipe.load import load_recipe

    no_eval = ["validation.eval_iters=0", "validation.eval_interval=null"]
    cfg = load_recipe(YAML, ["train.train_iters=10", "checkpoint.save=null", *no_eval]).config
    runtime_config_update(cfg)
    assert get_train_valid_test_num_samples(cfg) == (20, 0, 0)  # no validation or test data: no evaluation
    assert cfg.train.exit_signal_handler


def test_graphs_off_through_overrides(tmp_path):
    from megatron.bridge.training.config import runtime_config_update

    from bridge_cudagraph.recipe.load import load_recipe

    off = ["model.cuda_graph.language.enabled=false", "model.cuda_graph.vision.enabled=false"]
    cfg = load_recipe(YAML, [*off, f"checkpoint.save={tmp_path}"]).config
    runtime_config_update(cfg)
    assert cfg.model.cuda_graph_impl == "none" and cfg.model.use_te_rng_tracker  # same RNG tracker as graphs on


def test_the_training_path_imports_without_diffusers_or_bridge_recipes():
    # The GPU machine has no diffusers, which megatron.bridge.recipes needs: hide it, import what run() imports
    # (but pretrain/finetune, whose nvidia_resiliency_ext only the GPU machine has), build and validate the recipe.
    code = textwrap.dedent(
        """
        import importlib.abc, sys

        class NoDiffusers(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "diffusers" or name.startswith("diffusers."):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)

        sys.meta_path.insert(0, NoDiffusers())
        import bridge_cudagraph.bridge.train
        from bridge_cudagraph.recipe.load import load_recipe
        from megatron.bridge.training.config import runtime_config_update
        cfg = load_recipe("recipes/tiny_qwen3_vl.yaml", ["checkpoint.save=null"]).config
        bridge_cudagraph.bridge.train.forward_step_for(cfg.model)
        runtime_config_update(cfg)
        bad = sorted(m for m in sys.modules if m.startswith("megatron.bridge.recipes"))
        assert not bad, bad
        """
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def _loader(cfg, split=0, consumed=0):
    from megatron.bridge.data.samplers import build_pretraining_data_loader
    from megatron.bridge.data.utils import get_dataset_provider

    provider = get_dataset_provider(cfg.dataset)  # Bridge's protocol adapter for DatasetProvider configs
    datasets = provider([100, 12, 4], cfg.dataset)
    ds = datasets[split]
    return ds, build_pretraining_data_loader(  # as loaders.build_train_valid_test_data_loaders calls it
        ds,
        consumed,
        cfg.dataset.dataloader_type,
        cfg.train.micro_batch_size,
        cfg.dataset.num_workers,
        cfg.dataset.data_sharding,
        collate_fn=ds.collate_fn,
        pin_memory=False,
        persistent_workers=cfg.dataset.persistent_workers,
        data_parallel_rank=0,
        data_parallel_size=1,
        global_batch_size=cfg.train.global_batch_size,
    )


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    return _validated(tmp_path_factory.mktemp("tiny"))


def test_datasets_have_the_sizes_bridge_asks_for(cfg):
    from megatron.bridge.data.utils import get_dataset_provider

    train, valid, test = get_dataset_provider(cfg.dataset)([100, 12, 0], cfg.dataset)
    assert len(train) >= 100 and len(valid) >= 12 and test is None


def test_batches_match_what_qwen3_vl_step_reads(cfg, monkeypatch):
    from megatron.bridge.models.qwen_vl import qwen3_vl_step
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.rope import get_rope_index

    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)  # the step moves tensors to the GPU
    _, loader = _loader(cfg)
    it = iter(loader)
    grids_seen, most_images = set(), 0
    pgc = type("PGC", (), {"tp": type("G", (), {"size": lambda self: 1})(), "cp": None})()
    pgc.cp = pgc.tp
    for _ in range(8):
        batch = next(it)
        assert set(batch) == BATCH_KEYS
        for key in ("input_ids", "labels", "loss_mask", "position_ids"):
            assert batch[key].shape == (2, 256), key
        tokens, labels, loss_mask, attention_mask, position_ids, mm = qwen3_vl_step.get_batch(
            iter([batch]), cfg, is_first_pp_stage=True, is_last_pp_stage=True
        )
        assert attention_mask is None and tokens.dtype == torch.long and loss_mask.dtype == torch.float32
        assert set(mm) == {"pixel_values", "image_grid_thw"}
        pixels, grid = mm["pixel_values"], mm["image_grid_thw"]
        assert pixels.shape == (int(grid.prod(-1).sum()), cfg.dataset.patch_dim) and grid.shape[1] == 3
        # one image token per merge**2 patches, per sample and in total
        assert int((tokens == IMAGE_TOKEN_ID).sum()) == int(grid.prod(-1).sum()) // 4
        # the step keeps the static length (no in-batch packing, TP=CP=1) ...
        out = qwen3_vl_step._pad_and_pack_qwen3_vl_step(
            tokens, labels, loss_mask, attention_mask, position_ids, pgc, use_fp8_padding=True, seq_length=256
        )
        assert out[0].shape == (2, 256) and out[5].cu_seqlens_q.tolist() == [0, 256, 512]
        # ... and the model's mRoPE indexing accepts the image layout.
        rope, _ = get_rope_index(2, IMAGE_TOKEN_ID, VIDEO_TOKEN_ID, VISION_START_TOKEN_ID, tokens, grid)
        assert rope.shape == (3, 2, 256)
        grids_seen |= {tuple(g) for g in grid.tolist()}
        per_sample = [int((row == VISION_START_TOKEN_ID).sum()) for row in tokens]
        most_images = max(most_images, *per_sample)
        assert min(per_sample) >= 1
    assert len(grids_seen) >= 3 and most_images >= 2  # images of several sizes, several per sample


def test_samples_are_a_function_of_their_index(cfg):
    ds, _ = _loader(cfg)
    a, b = ds[5], ds[5]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(ds[5]["input_ids"], ds[6]["input_ids"])
    _, valid_loader = _loader(cfg, split=1)
    assert not torch.equal(next(iter(valid_loader))["input_ids"][0], ds[0]["input_ids"])


def test_resume_sees_the_batches_an_uninterrupted_run_sees(cfg):
    _, fresh = _loader(cfg)
    _, resumed = _loader(cfg, consumed=6)  # Bridge builds the loader from the loaded consumed_train_samples
    uninterrupted = [b for _, b in zip(range(6), fresh, strict=False)][3:]
    for x, y in zip(uninterrupted, resumed, strict=False):
        assert torch.equal(x["input_ids"], y["input_ids"])
        assert torch.equal(x["visual_inputs"].pixel_values, y["visual_inputs"].pixel_values)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(max_images_per_sample=8), "more than seq_length"),
        (dict(image_grids=[[1, 7, 8]]), "multiples of 2"),
        (dict(pad_to_max_length=False), "static shapes"),
        (dict(enable_in_batch_packing=True), "static shapes"),
    ],
)
def test_dataset_refuses_settings_it_cannot_honour(change, match):
    with pytest.raises(ValueError, match=match):
        TinyVLMDatasetConfig(**change).finalize()


def test_bridge_builds_the_learning_rate_scheduler_from_it(tmp_path):
    """Bridge's own scheduler construction (setup_optimizer's second half) accepts the recipe's settings; a
    missing weight-decay schedule made it assert at set-up on the GPU (start_wd None)."""
    from megatron.bridge.training.optim import _get_scheduler

    cfg = _validated(tmp_path)
    optimizer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], lr=cfg.optimizer.lr)
    scheduler = _get_scheduler(cfg.optimizer, cfg.scheduler, optimizer)
    scheduler.step(1)
    assert optimizer.param_groups[0]["weight_decay"] == cfg.scheduler.start_weight_decay
