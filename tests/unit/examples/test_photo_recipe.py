"""The photo recipe: Bridge's Qwen3-VL packing settings, finalized and planned as Bridge's training would."""

from __future__ import annotations

from pathlib import Path

from bridge_cudagraph.plan.from_config import plan_config
from bridge_cudagraph.recipe.load import load_recipe
from tests.unit.test_bad_configs import PADDED_ROWS

YAML = Path(__file__).resolve().parents[3] / "recipes" / "tiny_qwen3_vl_photos.yaml"


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
    plan = plan_config(loaded.config, world_size=loaded.world(), base_checkpoint_needed=False)
    packed = plan.language.packed
    assert packed is not None and packed.token_budgets[-1] == 2 * 2048 and packed.max_sequences == 2
    assert packed.separate_padded and packed.copies == 1
    assert plan.vision is not None and plan.vision.max_patches_per_image == 3920
    assert plan.vision.token_budgets == (1024, 2048, 4096, 8192)


def test_the_moe_recipe_packs_and_plans_attention_graphs_with_the_mlp_half_eager(tmp_path, monkeypatch):
    """``recipes/tiny_qwen3_vl_moe_photos.yaml``: the MoE tiny Qwen3-VL, pure M4, on Bridge's packing deferred to the
    step as the dense photo recipe; ``language.modules: null`` on packed MoE layers plans the attention on the ladder
    (one graph per layer, the dense packed layers' static inputs; the MLP half eager on the micro-batch's own tokens),
    and the finalized provider carries that scope for megatron-core's layers."""
    from bridge_cudagraph.bridge.providers import CudaGraphQwen3VLMoEModelProvider

    monkeypatch.setenv("BRIDGE_CUDAGRAPH_CACHE", str(tmp_path))
    loaded = load_recipe(YAML.with_name("tiny_qwen3_vl_moe_photos.yaml"))
    cfg = loaded.config
    assert isinstance(cfg.model, CudaGraphQwen3VLMoEModelProvider) and cfg.model.num_moe_experts == 4
    assert cfg.dist.use_decentralized_pg and cfg.logger.log_interval == 1
    assert cfg.dataset.enable_in_batch_packing and cfg.dataset.defer_in_batch_packing_to_step
    assert cfg.model.cuda_graph.language.modules is None
    assert cfg.dataset.source.schema_adapter == "cord_v2" and cfg.model.seq_length == cfg.dataset.seq_length == 2048
    plan = plan_config(loaded.config, world_size=loaded.world(), base_checkpoint_needed=False)
    packed = plan.language.packed
    assert packed is not None and packed.token_budgets[-1] == 2 * 2048 and packed.separate_padded
    assert not packed.tight  # the router's losses count each row's padding, as Bridge's step routes it
    assert plan.language.modules == ("attn",) and plan.language.graph_unit == "layer"
    assert plan.language.graphs_per_stage == (4 * len(packed.token_budgets),)
    _, inputs = packed.static_inputs[-1]
    assert [i.name for i in inputs][-1] == "cu_seqlens_padded"
    modules = [getattr(m, "name", m) for m in loaded.config.model.cuda_graph_modules]
    assert modules == ["attn"]  # what megatron-core's MoE layer reads: nothing of it returns early
    text = plan.describe()
    assert "[attn] (null on MoE layers)" in text
    assert "router, dispatch, experts and combine run eagerly" in text and "padding_mask" not in text
    assert plan.vision is not None and plan.vision.token_budgets == (1024, 2048, 4096, 8192)


def test_the_moe_recipe_pads_on_the_ladder_with_modules_null(tmp_path, monkeypatch):
    """Padded MoE rows with ``modules: null``: the attention scope on the padded ladder, one rung of the micro-batch's
    shape, each MoE layer a graph of its own; megatron-core's layers read the same scope."""
    monkeypatch.setenv("BRIDGE_CUDAGRAPH_CACHE", str(tmp_path))
    loaded = load_recipe(YAML.with_name("tiny_qwen3_vl_moe_photos.yaml"), PADDED_ROWS)
    plan = plan_config(loaded.config, world_size=loaded.world(), base_checkpoint_needed=False)
    padded = plan.language.padded
    assert plan.language.packed is None and padded is not None and padded.token_budgets == (2 * 2048,)
    assert plan.language.modules == ("attn",) and plan.language.graph_unit == "layer"
    assert plan.language.graphs_per_stage == (4,)
    assert [getattr(m, "name", m) for m in loaded.config.model.cuda_graph_modules] == ["attn"]
    text = plan.describe()
    assert "[attn] (null on MoE layers)" in text and "TECudaGraphHelper" not in text
