"""The bundled recipes' plans, pinned as literal numbers, and the helper arguments a run builds from them.

``bridge-cudagraph plan`` prints these plans and ``train`` captures them (both through
:func:`bridge_cudagraph.plan.from_config.plan_config`); the numbers are written out here, not recomputed, so a change
in any derivation (budgets, micro-batches, copies, warmup, static shapes) shows up as a failing line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge_cudagraph.capture.from_plan import padded_helper_arguments, vision_helper_arguments
from bridge_cudagraph.plan.from_config import plan_config
from bridge_cudagraph.recipe.load import load_recipe

RECIPES = Path(__file__).resolve().parents[3] / "recipes"


def _shapes(inputs):
    return [(s.name, s.shape, s.dtype) for s in inputs]


# recipe, overrides, world size -> the numbers of its plan
CASES = {
    "tiny-1": (
        "tiny_qwen3_vl.yaml",
        [],
        1,
        dict(
            mbs=2,
            gbs=2,
            num_mb=1,
            language_graphs_per_stage=(3,),  # runs of layers 0, 1, 2-3 (a deepstack merge follows layers 0 and 1)
            language_merges=2,
            language_warmup=3,
            language_inputs=[
                ("hidden_states", (256, 2, 512), "bf16"),
                ("rotary_pos_emb", (256, 2, 1, 64), "fp32"),
            ],
            # 256 x 2**2 x 2 = 2048 patches at most; rungs multiples of 64, <= 1.25x apart above 5 x 64
            budgets=(64, 128, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1088, 1344, 1664, 2048),
            images=32,
            max_patches=2048,  # synthetic images, no processor: the largest budget
            copies=1,
            vision_graphs=3 * 15,  # layers 0-1, 2, 3 (deepstack layers 1 and 2) x 15 budgets
            vision_warmup=3,
            vision_inputs_at_first=[
                ("hidden_states", (64, 1, 256), "bf16"),
                ("rotary_pos_emb", (64, 1, 1, 64), "fp32"),
                ("cu_seqlens", (34,), "int32"),
            ],
        ),
    ),
    "qwen3-8b-8": (  # unpacked (the file packs offline: test_the_offline_packed_plan_holds_the_pinned_numbers)
        "qwen3_8b_sft_graphs.yaml",
        [
            "dataset.enable_offline_packing=false",
            "dataset.offline_packing_specs=null",
            "dataset.dataloader_type=single",
        ],
        8,
        dict(
            mbs=1,
            gbs=32,
            num_mb=16,
            language_graphs_per_stage=(1,),  # GPT: nothing runs between the layers, one run of 36
            language_merges=0,
            language_warmup=3,
            language_inputs=[
                ("hidden_states", (2048, 1, 4096), "bf16"),
                ("rotary_pos_emb", (2048, 1, 1, 128), "fp32"),
            ],
        ),
    ),
    "qwen3-vl-8b-8-pp2": (
        "qwen3_vl_8b_sft_graphs.yaml",
        ["model.pipeline_model_parallel_size=2", "model.cuda_graph.vision.warmup_steps=5"],
        8,
        dict(
            mbs=2,
            gbs=128,
            num_mb=32,
            language_graphs_per_stage=(4 * 2, 1 * 2),  # runs 0, 1, 2, 3-17 on stage 0, 0-17 on stage 1; x 2 in flight
            language_merges=3,
            language_warmup=3,
            language_inputs=[
                ("hidden_states", (4096, 2, 4096), "bf16"),
                ("rotary_pos_emb", (4096, 2, 1, 128), "fp32"),
            ],
            # 4096 x 2**2 x 2 = 32768 patches at most, down to 32768 / 64 = 512; multiples of 64, <= 1.25x apart
            budgets=(
                *(512, 576, 704, 832, 1024, 1280, 1536, 1920, 2368, 2944, 3648),
                *(4544, 5632, 6976, 8704, 10816, 13504, 16832, 20992, 26240, 32768),
            ),
            images=32768 // 784,  # images of >= 784 patches: the collate's min_pixels 200704 // 16**2
            max_patches=3920,  # Bridge's Qwen-VL collate: max_pixels 1003520 // 16**2
            copies=2,
            vision_graphs=4 * 21 * 2,  # 4 segments (deepstack 8, 16, 24 of 27) x 21 budgets x 2 copies
            vision_warmup=5,
            vision_inputs_at_first=[
                ("hidden_states", (512, 1, 1152), "bf16"),
                ("rotary_pos_emb", (512, 1, 1, 72), "fp32"),
                ("cu_seqlens", (1 + 41 + 9,), "int32"),  # the 32768-patch tail in 9 pieces of at most 3920
            ],
        ),
    ),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def planned(request):
    name, overrides, world, expected = CASES[request.param]
    return plan_config(
        load_recipe(RECIPES / name, overrides).config,
        world_size=load_recipe(RECIPES / name, overrides).world(world),
        base_checkpoint_needed=False,
    ), expected


def test_the_plan_holds_the_pinned_numbers(planned):
    plan, want = planned
    assert (plan.micro_batch_size, plan.global_batch_size, plan.num_microbatches) == (
        want["mbs"],
        want["gbs"],
        want["num_mb"],
    )
    assert plan.language.enabled and plan.language.graphs_per_stage == want["language_graphs_per_stage"]
    assert plan.language.warmup_steps == want["language_warmup"]
    assert _shapes(plan.language.static_inputs) == want["language_inputs"]
    if "budgets" not in want:
        assert plan.vision is None
        return
    v = plan.vision
    assert v.enabled and v.token_budgets == want["budgets"] and v.max_images_per_microbatch == want["images"]
    assert (v.copies, v.graphs, v.warmup_steps) == (want["copies"], want["vision_graphs"], want["vision_warmup"])
    assert _shapes(v.inputs_at(v.token_budgets[0])) == want["vision_inputs_at_first"]
    assert v.max_patches_per_image == want["max_patches"]
    tail = -(-want["budgets"][-1] // want["max_patches"])
    assert all(inputs[2].shape == (1 + want["images"] + tail,) for _, inputs in v.static_inputs)


def test_the_helpers_get_exactly_the_plans_numbers(planned):
    """What :meth:`~bridge_cudagraph.bridge.mixin.CudaGraphProviderMixin.make_graph_helpers` passes the helpers'
    constructors (the GPU test ``tests/gpu/test_plan_helpers.py`` checks the constructed helpers hold them)."""
    plan, want = planned
    language = padded_helper_arguments(plan)  # whole dense layers of padded rows: the ladder
    hidden = want["language_inputs"][0][1]  # (S/cp, mbs, H)
    assert language == {
        "rows": want["mbs"],
        "width": hidden[0],
        "copies": plan.language.graphs_per_unit,
        "static_inputs": plan.language.static_inputs,
        "on_capture_error": "eager",
        "graph_unit": "run",  # graph_unit unset: runs of layers between deepstack merges
        "deepstack_merges": want["language_merges"],
    }
    assert plan.language.graphs_per_unit == (1 if plan.facts.pp == 1 else min(plan.facts.pp, want["num_mb"]))
    if "budgets" in want:
        vision = vision_helper_arguments(plan)
        assert vision == {
            "budgets": list(want["budgets"]),
            "max_segments": want["images"],
            "max_seqlen": want["max_patches"],  # max_patches_per_image unset: from the data path
            "copies": want["copies"],
            "graph_unit": "run",  # graph_unit unset: graphs cut after each deepstack layer
            "static_inputs": dict(plan.vision.static_inputs),
            "on_capture_error": "eager",
        }


def test_plan_prints_the_same_object_it_planned(planned):
    """``describe()`` renders the data: every static shape appears in the printed block."""
    plan, _ = planned
    text = plan.describe()
    for s in plan.language.static_inputs:
        assert s.describe() in text
    assert f"capture after {plan.language.warmup_steps} steps" in text


def test_the_offline_packed_plan_holds_the_pinned_numbers():
    """Qwen3 8B on Bridge's offline packing (the recipe file as it is): one budget of seq_length per packed row,
    micro-batch 1, 2048 / 32 = 64 sequences, no separate padded boundaries (pad_seq_to_mult 1), and the helper gets
    exactly these (:func:`~bridge_cudagraph.capture.from_plan.packed_helper_arguments`)."""
    from bridge_cudagraph.capture.from_plan import packed_helper_arguments

    plan = plan_config(
        load_recipe(RECIPES / "qwen3_8b_sft_graphs.yaml").config,
        world_size=load_recipe(RECIPES / "qwen3_8b_sft_graphs.yaml").world(8),
        base_checkpoint_needed=False,
    )
    packed = plan.language.packed
    assert (plan.micro_batch_size, plan.num_microbatches) == (1, 16)
    assert packed.offline and packed.token_budgets == (2048,) and packed.budgets_derived is not False
    assert (packed.max_sequences, packed.max_seqlen, packed.separate_padded) == (64, 2048, False)
    assert plan.language.graphs_per_stage == (1,)  # one run of the 36 layers, one budget
    ((budget, inputs),) = packed.static_inputs
    assert budget == 2048 and _shapes(inputs) == [
        ("hidden_states", (2048, 1, 4096), "bf16"),
        ("rotary_pos_emb", (2048, 1, 1, 128), "fp32"),
        ("cu_seqlens", (66,), "int32"),
    ]
    args = packed_helper_arguments(plan)
    assert args["layout"] == packed.layout and args["separate_padded"] is False and args["copies"] == 1
    assert "offline-packed rows of S 2048" in plan.describe()


def test_the_30b_a3b_moe_recipe_plans_packed_moe_graphs_at_ep_8():
    """Qwen3-VL 30B-A3B as the recipe file sets it (Bridge's packing, EP 8, ``modules: null``): Bridge's Qwen3-VL step
    pads every row to seq_length at ep > 1, so one rung of mbs x seq_length and no tail; each of the 48 MoE layers'
    attention is a graph of its own, with the dense packed layers' static inputs."""
    from bridge_cudagraph.capture.from_plan import packed_helper_arguments

    loaded = load_recipe(RECIPES / "qwen3_vl_30b_a3b_sft_graphs.yaml")
    plan = plan_config(loaded.config, world_size=loaded.world(8), base_checkpoint_needed=False)
    packed = plan.language.packed
    assert plan.facts.ep == 8 and plan.facts.num_moe_experts == 128
    assert packed is not None and packed.token_budgets == (2 * 4096,) and not packed.tight
    assert plan.language.modules == ("attn",) and plan.language.graph_unit == "layer"
    assert plan.language.graphs_per_stage == (48,)
    ((budget, inputs),) = packed.static_inputs
    assert [name for name, *_ in _shapes(inputs)] == [
        "hidden_states",
        "rotary_pos_emb",
        "cu_seqlens",
        "cu_seqlens_padded",
    ]
    assert packed_helper_arguments(plan)["static_inputs"] == {budget: inputs}
