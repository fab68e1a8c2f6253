"""``examples.random_base`` on CPU: what a base is (its stamp), when a folder is reused or refused, and that
building one needs a GPU; the build itself runs on the GPU machine (the 8B recipe's device command)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge_cudagraph.examples import random_base
from bridge_cudagraph.examples.random_base import STAMP, RandomBaseError, base_spec, build_random_base, existing_base
from bridge_cudagraph.examples.tiny_recipe import tiny_qwen3_vl_config

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def config(tmp_path):
    cfg = tiny_qwen3_vl_config(checkpoint_dir=str(tmp_path / "ckpt"))
    cfg.checkpoint.pretrained_checkpoint = str(tmp_path / "base")
    return cfg


def _stamp(folder: Path, spec: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / STAMP).write_text(json.dumps(spec))


def test_the_spec_names_the_model_its_shape_and_the_seed(config):
    spec = base_spec(config)
    assert spec["provider"] == type(config.model).__name__ and spec["seed"] == config.rng.seed
    assert spec["model"]["num_layers"] == config.model.num_layers and spec["ckpt_format"] == "torch_dist"
    assert spec["vision"]["depth"] == config.model.vision_config.depth
    json.dumps(spec)  # the stamp is plain JSON
    config.rng.seed += 1
    assert base_spec(config) != spec


def test_an_absent_folder_is_built_only_on_a_gpu(config):
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU this would build the base")
    assert not existing_base(config.checkpoint.pretrained_checkpoint, base_spec(config))
    with pytest.raises(RandomBaseError, match="needs a CUDA GPU"):
        build_random_base(config, log=lambda line: None)
    assert not Path(config.checkpoint.pretrained_checkpoint).exists()


def test_a_folder_of_something_else_is_never_overwritten(config):
    folder = Path(config.checkpoint.pretrained_checkpoint)
    folder.mkdir()
    (folder / "mine.txt").write_text("keep")
    with pytest.raises(RandomBaseError, match="is not a random base checkpoint"):
        build_random_base(config)
    assert (folder / "mine.txt").read_text() == "keep" and sorted(p.name for p in folder.iterdir()) == ["mine.txt"]


def test_the_base_of_another_seed_is_refused(config):
    spec = base_spec(config)
    _stamp(Path(config.checkpoint.pretrained_checkpoint), {**spec, "seed": spec["seed"] + 1})
    with pytest.raises(RandomBaseError, match="differs in seed"):
        build_random_base(config)


def test_a_stamp_without_a_checkpoint_is_refused(config):
    _stamp(Path(config.checkpoint.pretrained_checkpoint), base_spec(config))
    with pytest.raises(RandomBaseError, match="no checkpoint Bridge can load"):
        build_random_base(config)


def test_a_matching_base_is_reused_without_building(config):
    """The stamp matches and Bridge's ``checkpoint_exists`` finds its tracker file: returned as it is, no GPU."""
    folder = Path(config.checkpoint.pretrained_checkpoint)
    _stamp(folder, base_spec(config))
    (folder / "latest_checkpointed_iteration.txt").write_text("0")  # the tracker Bridge's save writes
    lines = []
    assert build_random_base(config, log=lines.append) == folder
    assert len(lines) == 1 and "reused" in lines[0]


def test_a_recipe_without_a_base_path_is_refused(capsys):
    """From the command line: one ``error:`` line and exit 2 (the tiny recipe names no base checkpoint)."""
    assert random_base.main([str(ROOT / "recipes" / "tiny_qwen3_vl.yaml")]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: the recipe sets no checkpoint.pretrained_checkpoint: there is nowhere to write a base"
    )


def test_bridges_default_fusion_passes_the_stack_check_without_apex(capsys):
    """The 8B recipe with Bridge's own default put back (``gradient_accumulation_fusion=true``): run 22's first call
    built for 30 s and died inside megatron-core's output layer, where APEX is absent. The plugin's provider builds
    it (:mod:`bridge_cudagraph.host.wgrad_fusion`), so the builder goes on to its GPU check, as with the fusion off."""
    import torch

    from bridge_cudagraph.host.compat import apex_gradient_accumulation_fusion_available

    if apex_gradient_accumulation_fusion_available():
        pytest.skip("APEX's fused_weight_gradient_mlp_cuda is installed here: the stack builds the fusion")
    if torch.cuda.is_available():
        pytest.skip("on a GPU the builder would build the base; this checks the refusal order without one")
    recipe = str(ROOT / "recipes" / "qwen3_vl_8b_peft_photos_graphs.yaml")
    assert random_base.main([recipe, "model.gradient_accumulation_fusion=true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: building a base checkpoint needs a CUDA GPU"), err
