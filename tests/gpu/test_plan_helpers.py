"""The helpers a run builds hold exactly its plan's numbers, and capture accepts the plan's static shapes: the tiny
recipe's plan (as ``bridge-cudagraph plan recipes/tiny_qwen3_vl.yaml`` prints it), its model, its helpers."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "tiny_qwen3_vl.yaml"


def test_helpers_built_from_the_tiny_recipes_plan_hold_its_values(world):
    from bridge_cudagraph.examples import tiny
    from bridge_cudagraph.plan.from_config import plan_config
    from bridge_cudagraph.recipe.load import load_recipe

    loaded = load_recipe(RECIPE)
    plan = plan_config(loaded.config, world_size=loaded.world(1), base_checkpoint_needed=False)
    provider = loaded.config.model
    model = tiny.build(provider, world.language, vision_pg_collection=world.vision)
    language, vision = provider.make_graph_helpers(model, plan=plan)

    # The recipe pads its rows: whole dense layers on the ladder engine, one rung of the plan's shape.
    padded = plan.language.padded
    assert padded is not None and type(language).__name__ == "PaddedLanguageGraphHelper"
    assert (language.rows, language.width) == (padded.rows, padded.width)
    assert (padded.rows, padded.width) == (plan.micro_batch_size, plan.facts.seq_length)
    assert language.copies.count == padded.copies
    assert language.planned_inputs == plan.language.static_inputs
    assert language.segments == [plan.language.segments_per_stage[0]]
    assert vision.budgets == list(plan.vision.token_budgets)
    assert vision.max_segments == plan.vision.max_images_per_microbatch
    assert vision.cu_seqlens_length == plan.vision.inputs_at(plan.vision.token_budgets[0])[2].shape[0]
    assert vision.copies.count == plan.vision.copies
    assert vision.planned_inputs == dict(plan.vision.static_inputs)

    # Capture checks every buffer against the plan's StaticInputs (capture.checks.check_static_inputs).
    for helper in (language, vision):
        helper.create_cudagraphs()
        assert helper.graphs_created() and helper.stats.failed is None, helper.stats.failed
        assert helper.stats.graphs > 0
    for helper in (language, vision):
        helper.delete_cuda_graphs()
