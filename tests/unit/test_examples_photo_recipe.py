"""The photo recipe: Bridge's Qwen3-VL packing settings, finalized and planned as Bridge's training would."""

from __future__ import annotations

from pathlib import Path

from bridge_cudagraph.recipe import load_recipe, plan_recipe

YAML = Path(__file__).resolve().parents[2] / "recipes" / "tiny_qwen3_vl_photos.yaml"


def test_recipe_packs_as_bridges_qwen3_vl_recipes_and_plans(tmp_path, monkeypatch):
    monkeypatch.setenv("BRIDGE_CUDAGRAPH_CACHE", str(tmp_path))
    # Bridge's Qwen3-VL step packs: the language graphs are the packed ones, their ladder derived from the recipe.
    loaded = load_recipe(YAML)
    cfg = loaded.config
    assert loaded.world_size == 1 and cfg.model.cuda_graph.vision.enabled and cfg.model.cuda_graph.language.enabled
    assert cfg.dataset.enable_in_batch_packing and cfg.dataset.defer_in_batch_packing_to_step
    assert cfg.dataset.source.schema_adapter == "cord_v2" and Path(cfg.dataset.source.path_or_dataset).is_dir()
    assert Path(cfg.dataset.hf_processor_path, "tokenizer.json").is_file()
    assert cfg.tokenizer.tokenizer_type == "NullTokenizer" and cfg.train.micro_batch_size == 2
    assert cfg.model.seq_length == cfg.dataset.seq_length == 2048
    plan = plan_recipe(loaded)
    packed = plan.language.packed
    assert packed is not None and packed.token_budgets[-1] == 2 * 2048 and packed.max_sequences == 2
    assert packed.separate_padded and packed.copies == 1
    assert plan.vision is not None and plan.vision.max_patches_per_image == 3920
    assert plan.vision.token_budgets == (1024, 2048, 4096, 8192)
