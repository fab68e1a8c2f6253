"""bridge_cudagraph.plan.memory: the per-rank estimate ``plan`` prints and ``--gpu-memory`` checks.

The estimate is held against what the captures measured on the H200 (the 2B shape with the ladder in one pool):
results/packed-2b-memory/run59/ut_small, one graph per layer: the language ladder up to 2112 tokens took 4.77 GiB over
28 layers, the vision ladder up to 4096 patches 3.41 GiB over 24 layers; results/packed-2b-levers/run70/ut_levers and
packed-2b-levers/run72/ut_flat, one graph per run of layers (the product's default, the widest run 25 layers): up to
1408 tokens 4.22 GiB, 2.97 GiB with TE's fused weight-gradient accumulation, and up to 2176 tokens (tight packing off)
5.20 GiB. The estimate must stay within 20% of each."""

from __future__ import annotations

import pytest

from bridge_cudagraph.config import CudaGraphConfigError, cuda_graph_config_from_dict
from bridge_cudagraph.plan.build import build_plan
from bridge_cudagraph.plan.facts import ModelFacts, VisionFacts
from bridge_cudagraph.plan.memory import GIB, MemoryEstimate, TrainingFacts, check_fits

pytestmark = pytest.mark.fast

VISION_2B = VisionFacts(
    depth=24,
    hidden_size=1024,
    num_heads=16,
    patch_size=16,
    temporal_patch_size=2,
    spatial_merge_size=2,
    deepstack_visual_indexes=(5, 11, 17),
    num_position_embeddings=2304,
    intermediate_size=4096,
    out_hidden_size=2048,
)
QWEN3_VL_2B = ModelFacts(
    provider="CudaGraphQwen3VLModelProvider",
    num_layers=28,
    hidden_size=2048,
    num_attention_heads=16,
    kv_channels=128,
    seq_length=4096,
    position_embedding_type="mrope",
    ffn_hidden_size=6144,
    num_query_groups=8,
    gated_linear_unit=True,
    vocab_size=151936,
    share_embeddings_and_output_weights=True,
    qk_layernorm=True,
    vision=VISION_2B,
)


def test_the_pools_estimate_is_within_20_percent_of_the_measured_ladders():
    from bridge_cudagraph.plan.memory import pool_estimate

    plan = _plan(
        language_budgets=[512, 640, 800, 1024, 1312, 1664, 2112, 2656, 3328, 4160, 5216, 6528, 8192],
        vision_budgets=[512, 1024, 2048, 4096],
    )
    language = pool_estimate(plan, "language", 2112)
    assert abs(4.77 * GIB / language - 1) < 0.2, language / GIB
    vision = pool_estimate(plan, "vision", 4096)
    assert abs(3.41 * GIB / vision - 1) < 0.2, vision / GIB


#: (language ladder, graph unit, fused weight gradients, captured top, measured GiB of the whole ladder).
RUNS_OF_LAYERS = [512, 640, 768, 928, 1152, 1408, 1760, 2176, 2720, 3392, 4224, 5280, 6592, 8192]
CAPTURES = {
    "run59_one_graph_per_layer": (
        [512, 640, 800, 1024, 1312, 1664, 2112, 2656, 3328, 4160, 5216, 6528, 8192],
        "layer",
        False,
        2112,
        4.77,
    ),
    "run72_runs_of_layers": (RUNS_OF_LAYERS, "run", False, 1408, 4.22),
    "run70_runs_of_layers_fused": (RUNS_OF_LAYERS, "run", True, 1408, 2.97),
    "run70_runs_of_layers_rows": (RUNS_OF_LAYERS, "run", False, 2176, 5.20),
}


@pytest.mark.parametrize("name", CAPTURES)
def test_the_language_estimate_follows_the_graph_unit_and_the_fusion(name):
    """A graph over a run of layers holds more of its layers' weight gradients in the pool than one of a layer
    (:data:`~bridge_cudagraph.plan.memory.GRADIENTS_HELD`), and none where TE fuses their accumulation."""
    import dataclasses

    from bridge_cudagraph.plan.facts import PackingFacts
    from bridge_cudagraph.plan.memory import pool_estimate

    budgets, unit, fused, top, measured = CAPTURES[name]
    facts = dataclasses.replace(QWEN3_VL_2B, gradient_accumulation_fusion=fused)
    cfg = cuda_graph_config_from_dict({"language": {"enabled": True, "token_budgets": budgets, "graph_unit": unit}})
    plan = build_plan(
        facts,
        cfg,
        world_size=1,
        micro_batch_size=2,
        global_batch_size=4,
        training=TrainingFacts(),
        packing=PackingFacts("qwen3_vl_step"),
    )
    assert max(end - start for start, end in plan.language.segments_per_stage[0]) == (1 if unit == "layer" else 25)
    estimate = pool_estimate(plan, "language", top)
    assert abs(measured * GIB / estimate - 1) < 0.2, (name, estimate / GIB, measured)


def _plan(facts=QWEN3_VL_2B, training=None, language_budgets=None, vision_budgets=(512, 1024, 2048, 4096)):
    from bridge_cudagraph.plan.facts import PackingFacts

    training = training or TrainingFacts()
    cfg = cuda_graph_config_from_dict(
        {
            "language": {"enabled": True, "token_budgets": language_budgets},
            "vision": {"enabled": True, "token_budgets": list(vision_budgets)},
        }
    )
    packing = PackingFacts("qwen3_vl_step") if language_budgets else None
    return build_plan(
        facts, cfg, world_size=1, micro_batch_size=2, global_batch_size=4, training=training, packing=packing
    )


def test_the_plan_carries_and_prints_its_estimate():
    plan = _plan()
    memory = plan.memory
    assert memory is not None and memory.language_graphs > 0 and memory.vision_graphs > 0
    params = (memory.weights) // 2
    assert 2.0e9 < params < 2.3e9, params  # Qwen3-VL-2B: about 2.1 B parameters
    assert memory.gradients == 4 * params and memory.optimizer == 12 * params  # one rank: nothing to shard
    lines = plan.describe().splitlines()
    assert any(line.startswith("memory per rank (estimate, GiB): weights 4.0") for line in lines), lines
    assert any("graph pools: language" in line for line in lines)
    assert max(map(len, lines)) <= 119


def test_peft_has_no_gradients_or_optimizer_state_for_the_frozen_base():
    lora = _plan(training=TrainingFacts(peft=True)).memory
    full = _plan().memory
    assert lora.weights == full.weights and lora.gradients == lora.optimizer == 0
    assert lora.language_graphs < full.language_graphs  # no gradient set for the frozen weights in the pool


def test_without_training_facts_the_plan_has_no_estimate():
    cfg = cuda_graph_config_from_dict({"language": {"enabled": True}})
    plan = build_plan(QWEN3_VL_2B, cfg, world_size=1, micro_batch_size=2, global_batch_size=4)
    assert plan.memory is None and "memory per rank" not in plan.describe()


def test_a_run_that_does_not_fit_is_refused_with_the_settings_to_change():
    memory = MemoryEstimate(
        weights=20 * GIB,
        gradients=20 * GIB,
        optimizer=30 * GIB,
        logits=2 * GIB,
        language_graphs=15 * GIB,
        vision_graphs=4 * GIB,
        language_top=8192,
        vision_top=4096,
        language_ladder=True,
    )
    check_fits(memory, 100, graphs_on=True, source="--gpu-memory 100")
    check_fits(memory, 80, graphs_on=False, source="--gpu-memory 80")  # 72 GiB without graphs
    with pytest.raises(CudaGraphConfigError) as info:
        check_fits(memory, 80, graphs_on=True, source="--gpu-memory 80")
    line = str(info.value)
    assert "\n" not in line and "about 91.0 GiB" in line and "--gpu-memory 80 gives 80 GiB" in line
    assert "model.cuda_graph.language.token_budgets below 8192 tokens" in line
    assert "model.cuda_graph.vision.token_budgets below 4096 patches" in line


def test_only_a_packed_ladder_is_told_to_lower_its_budgets():
    padded = _plan().memory
    packed = _plan(language_budgets=[512, 1024, 2048]).memory
    assert not padded.language_ladder and packed.language_ladder
    assert packed.language_top == 2048 and padded.language_top == 2 * 4096  # micro batch x seq_length, padded
    with pytest.raises(CudaGraphConfigError) as info:
        check_fits(padded, 1, graphs_on=True, source="--gpu-memory 1")
    assert "language.token_budgets" not in str(info.value) and "vision.token_budgets below 4096" in str(info.value)
