"""The useful-tokens benchmark on MoE models, CPU parts: ``--model tiny-moe`` and ``--model moe-30b-a3b-shape`` on
the command line, their providers (experts, top-k, layers, the graph scope of each variant; no model is built), the
30B-A3B shape against Bridge's own provider, ours_packed planned in the packed MoE scope (a refusal recorded, not
failed), and how a refusal, the padded speed-ups and the capture counters read in the report."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import report, useful_tokens
from benchmarks.tests.useful_tokens_runs import IDS, offline_run

ROOT = Path(__file__).resolve().parents[2]
#: The photo processor's special ids (the tiny tokenizer's), as :func:`useful_tokens.token_ids` gives them.
MOE_MODELS = ("tiny-moe", "moe-30b-a3b-shape")


def _run(model: str, *extra: str) -> useful_tokens.BenchRun:
    """A run of ``model`` (:func:`benchmarks.tests.useful_tokens_runs.offline_run`)."""
    return offline_run(model, *extra)


@pytest.mark.fast
def test_moe_models_on_the_command_line():
    for model in MOE_MODELS:
        args = useful_tokens.parse_args(["--out", "x", "--model", model])
        assert useful_tokens.check_args(args) is None
        assert (args.seq, args.mbs, args.num_mb) == (4096, 2, 2)  # the benchmark's shape, not a recipe's
        assert useful_tokens.MODELS[model].variants == ("eager_packed", "eager_padded", "ours_padded", "ours_packed")
        ok = useful_tokens.parse_args(["--out", "x", "--model", model, "--variants", "eager_packed,ours_padded"])
        assert useful_tokens.check_args(ok) is None
    # the dense models keep every variant
    assert useful_tokens.MODELS["tiny"].variants == report.VARIANTS


@pytest.mark.fast
def test_an_moe_model_refuses_upstream_on_the_command_line(capsys):
    assert useful_tokens.main(["--out", "x", "--model", "tiny-moe", "--variants", "eager_packed,upstream_padded"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: --variants eager_packed,upstream_padded: the tiny-moe model measures "
        "eager_packed,eager_padded,ours_padded,ours_packed,eager_padded_repeat; choose from them"
    ]
    with pytest.raises(SystemExit):
        useful_tokens.parse_args(["--out", "x", "--model", "moe-30b"])  # not a model
    capsys.readouterr()


@pytest.mark.parametrize(
    ("model", "experts", "topk", "layers", "hidden", "vision_depth"),
    [("tiny-moe", 4, 2, 4, 512, 4), ("moe-30b-a3b-shape", 128, 8, 4, 2048, 27)],
)
def test_moe_providers_carry_the_experts_and_each_variants_graph_scope(
    model, experts, topk, layers, hidden, vision_depth
):
    """Every variant's provider is the MoE class with the model's experts, top-k and depth, the photo processor's ids
    and the run's sequence; eager: no graphs; ours_padded: language graphs of each MoE layer's attention on the
    padded ladder (``modules`` null, the MLP half eager) and vision graphs on the data's budgets, which the plan
    accepts (one graph per layer); ours_packed: the same scope on the run's packed ladder, and vision."""
    from bridge_cudagraph.bridge.providers import CudaGraphQwen3VLMoEModelProvider
    from bridge_cudagraph.testing.plans import plan_for

    run = _run(model)
    variants = (*useful_tokens.MODELS[model].variants, report.CONTROL)
    providers = {v: useful_tokens.variant_provider(run, v) for v in variants}
    for variant, p in providers.items():
        assert isinstance(p, CudaGraphQwen3VLMoEModelProvider), variant
        assert (p.num_moe_experts, p.moe_router_topk, p.num_layers, p.hidden_size) == (experts, topk, layers, hidden)
        assert p.vision_config.depth == vision_depth and p.vision_config.out_hidden_size == hidden
        assert p.seq_length == p.language_max_sequence_length == 4096
        assert {k: getattr(p, k) for k in IDS} == IDS
        assert not p.freeze_language_model and not p.freeze_vision_model  # full fine-tune, as Bridge's SFT recipe
    for variant in ("eager_packed", "eager_padded", report.CONTROL):
        block = providers[variant].cuda_graph
        assert not block.language.enabled and not block.vision.enabled, variant
    padded = providers["ours_padded"].cuda_graph
    assert padded.language.enabled and padded.language.modules is None
    assert padded.vision.enabled and padded.vision.token_budgets == run.cfg.vision_budgets()
    assert padded.on_capture_error == "raise"
    plan = plan_for(providers["ours_padded"], world_size=1, micro_batch_size=2, num_microbatches=2)
    assert plan.language.enabled and plan.language.packed is None and plan.language.graph_unit == "layer"
    assert plan.language.modules == ("attn",) and plan.language.padded is not None
    assert plan.language.captured_per_stage == (layers,) and plan.vision is not None
    packed = providers["ours_packed"].cuda_graph  # planned by the product: test_ours_packed_on_moe_plans_...
    assert packed.language.enabled and packed.language.token_budgets and packed.vision.enabled
    assert packed.language.modules is None


def test_the_30b_a3b_shape_is_bridges_own_provider_at_reduced_depth():
    """The shape fields of ``moe-30b-a3b-shape`` against Bridge's own provider of Qwen3-VL-30B-A3B (``AutoBridge`` on
    the committed HF config, offline): the same layer and vision encoder, 4 language layers instead of 48."""
    from megatron.bridge import AutoBridge

    from bridge_cudagraph.recipe.offline import offline_hf_config

    with offline_hf_config(ROOT / "recipes" / "hf_configs" / "Qwen--Qwen3-VL-30B-A3B-Instruct") as repo_id:
        bridge = AutoBridge.from_hf_pretrained(repo_id).to_megatron_provider(load_weights=False)
    ours = useful_tokens.qwen3_vl_30b_a3b_shape_provider(seq_length=4096)
    assert type(bridge).__name__ == "Qwen3VLMoEModelProvider" and isinstance(ours, type(bridge))
    same = (
        "hidden_size", "ffn_hidden_size", "moe_ffn_hidden_size", "num_attention_heads", "num_query_groups",
        "kv_channels", "num_moe_experts", "moe_router_topk", "moe_grouped_gemm", "moe_router_load_balancing_type",
        "moe_aux_loss_coeff", "moe_token_dispatcher_type", "moe_router_dtype", "moe_router_score_function",
        "moe_permute_fusion", "moe_layer_freq", "vocab_size", "share_embeddings_and_output_weights", "mrope_section",
        "rotary_base", "layernorm_epsilon", "qk_layernorm", "gated_linear_unit", "add_bias_linear", "normalization",
        "deepstack_visual_indexes", "spatial_merge_size", "patch_size", "temporal_patch_size",
    )  # fmt: skip
    assert {k: getattr(ours, k) for k in same} == {k: getattr(bridge, k) for k in same}
    assert ours.num_moe_experts == 128 and ours.moe_router_topk == 8 and ours.moe_grouped_gemm
    vision = (
        "depth", "hidden_size", "intermediate_size", "num_heads", "out_hidden_size", "deepstack_visual_indexes",
        "patch_size", "spatial_merge_size", "temporal_patch_size", "num_position_embeddings", "in_channels",
        "hidden_act",
    )  # fmt: skip
    assert {k: getattr(ours.vision_config, k) for k in vision} == {k: getattr(bridge.vision_config, k) for k in vision}
    assert (ours.num_layers, bridge.num_layers) == (useful_tokens.MOE_30B_LAYERS, 48) and ours.num_layers == 4
    assert ours.bf16 and not ours.gradient_accumulation_fusion  # the benchmark's settings, as the 2B shape's


@pytest.mark.parametrize(("model", "experts"), [("tiny-moe", 4), ("moe-30b-a3b-shape", 128)])
def test_ours_packed_on_moe_plans_the_packed_moe_scope(model, experts):
    """The plan accepts packed language graphs on MoE layers in the product's packed MoE scope: ours_packed is not
    refused, its plan is the run's packed ladder with one graph per layer over the attention and the dense packed
    layers' static inputs; a refusal (were there one) is still recorded, not failed."""
    from bridge_cudagraph.plan.checks import MOE_ATTENTION_SCOPE

    run = _run(model)
    assert useful_tokens.refusal(run, "ours_packed") is None
    provider = useful_tokens.variant_provider(run, "ours_packed")
    assert provider.num_moe_experts == experts
    assert provider.cuda_graph.language.modules is None  # null: the attention scope on an MoE model
    plan = useful_tokens.packed_plan(run, provider)
    assert plan.language.packed is not None and plan.language.graph_unit == "layer"
    assert plan.language.modules == MOE_ATTENTION_SCOPE
    assert plan.language.packed.token_budgets == tuple(run.layout.budgets)
    budget, inputs = plan.language.packed.static_inputs[-1]
    assert "padding_mask" not in [i.name for i in inputs] and inputs[0].shape[0] == budget
    # tight packing off on MoE (the router's losses count each row's padding): the helper's check expects it off
    assert not plan.language.packed.tight and not useful_tokens.packs_tightly("ours_packed", plan)
    refused = {"status": report.REFUSED, "form": "packed", "graphed": True, "reason": "x", "seconds": 0.0}
    data = {"variants": {"eager_packed": {"status": "ok"}, "ours_packed": refused}}
    assert useful_tokens.failed_variants(data) == []
    assert useful_tokens.failed_variants({"variants": {"eager_packed": {"status": "ok"}}}) == ["ours_packed"]
    crashed = {"variants": {"eager_packed": {"status": "ok"}, "ours_packed": {"status": "failed"}}}
    assert useful_tokens.failed_variants(crashed) == ["ours_packed"]
    # --variants without ours_packed (a padded set): not asked, so not failed; what was asked still counts.
    padded = {"variants": {"eager_packed": {"status": "ok"}, "eager_padded": {"status": "ok"}}}
    assert useful_tokens.failed_variants(padded, ("eager_packed", "eager_padded")) == []
    assert useful_tokens.failed_variants(padded, ("eager_packed", "eager_padded", "ours_padded")) == ["ours_padded"]
    why = useful_tokens.paired_skip_reason(data["variants"], lambda: 1 << 40)
    assert why == "ours_packed was refused by the capture plan"


@pytest.mark.parametrize("model", ["tiny", "small"])
def test_dense_models_are_not_refused_and_keep_their_providers(model):
    """The table (``MODELS``) makes the dense providers: graphs off for the eager forms; ours_padded's block with
    language and vision graphs, the vision ladder from the data and capture failures raised (never timed as eager);
    ours_packed's the same with the run's language ladder; upstream's the host's class with megatron-core's per-layer
    graphs, vision included, at a vision length that holds the largest micro-batch. The plan accepts the packed
    graphs."""
    run = _run(model)
    assert useful_tokens.refusal(run, "ours_packed") is None
    eager = useful_tokens.variant_provider(run, "eager_packed")
    assert not (eager.cuda_graph and eager.cuda_graph.language.enabled)
    padded = useful_tokens.variant_provider(run, "ours_padded").cuda_graph
    assert padded.language.enabled and padded.vision.enabled and padded.on_capture_error == "raise"
    assert list(padded.vision.token_budgets) == run.cfg.vision_budgets()
    assert padded.vision.max_images_per_microbatch == run.cfg.vision_max_segments()
    packed = useful_tokens.variant_provider(run, "ours_packed").cuda_graph
    assert list(packed.language.token_budgets) == list(run.layout.budgets) and packed.vision == padded.vision
    plan = useful_tokens.packed_plan(run, useful_tokens.variant_provider(run, "ours_packed"))  # as the helper's check
    assert plan.language.packed.tight and useful_tokens.packs_tightly("ours_packed", plan)
    assert not useful_tokens.packs_tightly("ours_packed_rows", plan)  # its tight packing was off (retired lever)
    upstream = useful_tokens.variant_provider(run, "upstream_padded")
    assert type(upstream).__name__ == "Qwen3VLModelProvider" and upstream.cuda_graph_impl == "transformer_engine"
    assert upstream.vision_cuda_graph_impl == "transformer_engine"
    assert upstream.max_vision_cuda_graph_seq_length == run.cfg.upstream_vision_seq_length()
    for variant in ("eager_packed", "ours_padded", "ours_packed"):
        assert useful_tokens.variant_provider(run, variant).image_token_id == IDS["image_token_id"], variant


def _rec(tok_s: float, **extra) -> dict:
    return {"status": "ok", "useful_tokens_per_s": tok_s, "step_ms_median": 1e6 / tok_s, "step_ms_iqr": 1.0, **extra}


@pytest.mark.fast
def test_the_report_reads_a_refusal_the_padded_speedups_and_the_counters():
    reason = "model.cuda_graph.language.enabled=true with packed micro-batches on an MoE model (4 experts): no"
    counters = {"language": {"replays": 16, "graphs": 4, "failed": None}, "vision": {"replays": 16, "graphs": 8}}
    data = report.finish(
        {
            "meta": {"config": {"model": "tiny-moe"}},
            "data": {},
            "variants": {
                "eager_packed": _rec(1000.0, parity={"reference": "eager_packed"}),
                "eager_padded": _rec(400.0, parity={"reference": "eager_padded"}),
                "ours_padded": _rec(1120.0, graphed=True, counters=counters),
                "ours_packed": {"status": report.REFUSED, "reason": reason, "form": "packed", "graphed": True},
            },
            "paired": {"status": "skipped", "reason": "ours_packed was refused by the capture plan"},
        }
    )
    summary = data["summary"]
    assert summary["ours_padded"] == {"eager_packed": pytest.approx(1.12), "eager_padded": pytest.approx(2.8)}
    assert summary["separate"] is None and summary["met"] is None
    assert "speedup_vs_eager_packed" not in data["variants"]["ours_packed"]
    row = report.variant_row("ours_packed", data["variants"]["ours_packed"])
    assert row[1] == f"refused: {reason}" and set(row[2:]) == {"n/a"}
    md = report.render_markdown(data)
    assert "**ours_padded (useful tokens/s)**: 1.12x vs eager_packed, 2.80x vs eager_padded" in md
    assert f"**ours_packed refused by the capture plan**: {reason}" in md
    assert "its graphs were not what was timed" not in md  # every submodule captured and replayed
    text = report.text_table(data)
    assert "ours_padded (useful tokens/s): 1.12x vs eager_packed, 2.80x vs eager_padded" in text
    assert "paired phase skipped: ours_packed was refused by the capture plan" in text
    assert report.counter_problems(counters) == []
    bad = {
        "language": {"replays": 0, "graphs": 4},
        "vision": {"replays": 9, "graphs": 0},
        "x": {"graphs": 2, "replays": 2, "failed": "RuntimeError: capture\nmore"},
    }
    assert report.counter_problems(bad) == [
        "language never replayed",
        "vision has no graphs",
        "x capture failed (RuntimeError: capture)",
    ]
    data["variants"]["ours_padded"]["counters"] = bad
    assert "**ours_padded: its graphs were not what was timed**: language never replayed" in (
        report.render_markdown(data)
    )


@pytest.mark.fast
def test_each_model_has_one_definition():
    """The command line's models are the table's; a recipe model is the recipe file's (no provider of its own)."""
    from benchmarks import recipe_variants

    assert set(recipe_variants.RECIPES) <= set(useful_tokens.MODELS)
    for name, model in useful_tokens.MODELS.items():
        assert (model.provider is None) == (name in recipe_variants.RECIPES), name
        assert model.description and set(model.variants) <= set(report.VARIANTS), name
