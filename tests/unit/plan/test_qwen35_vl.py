"""Qwen3.5-VL on the CPU, with Bridge's own providers: the graph-enabled classes, the facts of the hybrid decoder
(gated-delta-net and standard attention layers), the plan of a Qwen3.5-VL run and its refusals."""

from __future__ import annotations

import dataclasses

import pytest
from _dist import run_world
from _qwen35 import tiny_qwen35
from megatron.bridge.models.qwen_vl.qwen3_vl_provider import Qwen3VLModelProvider
from megatron.bridge.models.qwen_vl.qwen35_vl_provider import Qwen35VLModelProvider, Qwen35VLMoEModelProvider

from bridge_cudagraph.bridge.providers import (
    CudaGraphQwen35VLModelProvider,
    CudaGraphQwen35VLMoEModelProvider,
    cuda_graph_class_for,
    with_cuda_graphs,
)
from bridge_cudagraph.config import CudaGraphConfigError, cuda_graph_config_from_dict
from bridge_cudagraph.examples.tiny_recipe import tiny_qwen3_vl_config
from bridge_cudagraph.host.compat import linear_attention_kernels_available
from bridge_cudagraph.plan.checks import check_linear_attention_kernels, check_stack
from bridge_cudagraph.plan.describe import describe_plan
from bridge_cudagraph.plan.facts import model_facts
from bridge_cudagraph.plan.from_config import plan_config


def qwen35_config(*, language: bool, vision: bool = True, moe: bool = False, **overrides):
    """The tiny Qwen3-VL recipe's ``ConfigContainer`` (synthetic data, pure M4 groups, one GPU) around
    :func:`tiny_qwen35` with the graph block."""
    cfg = tiny_qwen3_vl_config()
    cfg.model = with_cuda_graphs(
        tiny_qwen35(moe, **overrides), language={"enabled": language}, vision={"enabled": vision}
    )
    return cfg


# --------------------------------------------------------------------------------------------------- providers
@pytest.mark.parametrize(
    ("host", "ours"),
    [
        (Qwen35VLModelProvider, CudaGraphQwen35VLModelProvider),
        (Qwen35VLMoEModelProvider, CudaGraphQwen35VLMoEModelProvider),
    ],
)
def test_bridges_qwen35_vl_providers_map_to_the_named_classes(host, ours):
    import bridge_cudagraph

    assert getattr(bridge_cudagraph, ours.__name__) is ours
    assert cuda_graph_class_for(host) is ours
    assert issubclass(ours, host)
    assert cuda_graph_class_for(ours) is ours


def test_a_qwen35_vl_provider_keeps_every_field_and_builds_a_vision_encoder():
    host = tiny_qwen35(mtp_num_layers=1)
    ours = with_cuda_graphs(host, vision={"enabled": True})
    assert type(ours) is CudaGraphQwen35VLModelProvider
    assert ours.has_vision_encoder()
    for f in dataclasses.fields(host):
        if f.init and f.name != "vision_config":
            assert getattr(ours, f.name) == getattr(host, f.name), f.name
    assert ours.vision_config is host.vision_config
    assert ours.cuda_graph.vision.enabled and not ours.cuda_graph.language.enabled


def test_a_subclass_of_a_qwen35_vl_provider_is_composed_with_the_vision_encoder():
    @dataclasses.dataclass
    class MyQwen35(Qwen35VLModelProvider):
        pass

    composed = cuda_graph_class_for(MyQwen35)
    assert issubclass(composed, MyQwen35) and composed.__name__ == "CudaGraphMyQwen35"
    assert composed.has_vision_encoder(None)


def _language_spec_under_explicit_groups(rank: int, world: int) -> dict:
    """On one gloo rank with the collection Bridge builds under ``dist.use_decentralized_pg=true`` and no
    ``parallel_state``: Bridge's provider and ours asked for the language block spec, as ``provide()`` asks."""
    from _dist import bridge_collection, no_parallel_state

    from bridge_cudagraph.testing.world import parallel_state_untouched

    host = tiny_qwen35()
    pgc = bridge_collection({})
    host._pg_collection = pgc  # what Bridge's provide_distributed_model stores
    try:
        host.build_language_spec()
        bridge_error = None
    except AssertionError as error:
        bridge_error = str(error)
    ours = with_cuda_graphs(host)
    with no_parallel_state():
        spec = ours.build_language_spec()
    return {
        "bridge_error": bridge_error,
        "attention": [layer.submodules.self_attention.module.__name__ for layer in spec.layer_specs],
        "untouched": parallel_state_untouched(),
    }


@pytest.mark.slow
def test_ours_builds_the_hybrid_block_spec_under_explicit_groups_where_bridges_cannot():
    """Bridge's ``provide()`` asks megatron-core for the block spec without a pipeline rank, which megatron-core then
    reads from ``parallel_state``; ours reads it off the collection, and the layers are the ones the facts name."""
    (result,) = run_world(1, _language_spec_under_explicit_groups)
    assert result["bridge_error"] == "pipeline_model parallel group is not initialized"
    linear = model_facts(tiny_qwen35()).linear_attention_layers
    assert [i for i, name in enumerate(result["attention"]) if name == "GatedDeltaNet"] == list(linear)
    assert {name for i, name in enumerate(result["attention"]) if i not in linear} == {"Qwen3VLSelfAttention"}
    assert result["untouched"]


# ------------------------------------------------------------------------------------------------------- facts
def test_the_facts_name_the_gated_delta_net_layers_as_megatron_core_builds_them():
    facts = model_facts(tiny_qwen35())
    assert facts.linear_attention_pattern == (1, 1, 1, 0, 1, 1, 1, 0)
    assert facts.linear_attention_layers == (0, 1, 2, 4, 5, 6)
    assert facts.vision is not None and facts.vision.deepstack_visual_indexes == ()
    assert (facts.vision.depth, facts.vision.hidden_size, facts.vision.out_hidden_size) == (2, 256, 512)
    assert facts.position_embedding_type == "mrope" and facts.rotary_dim == 16  # kv 64 x Qwen3.5's 0.25

    listed = model_facts(tiny_qwen35(linear_attention_freq=[1, 0, 1, 0, 1, 1, 0, 0]))
    assert listed.linear_attention_layers == (0, 2, 4, 5)


def test_a_model_without_linear_attention_has_no_pattern():
    qwen3_vl = tiny_qwen3_vl_config().model
    assert isinstance(qwen3_vl, Qwen3VLModelProvider)
    assert model_facts(qwen3_vl).linear_attention_pattern == ()
    assert model_facts(tiny_qwen35(experimental_attention_variant=None)).linear_attention_layers == ()


def test_a_linear_attention_list_of_the_wrong_length_is_refused_with_the_setting():
    provider = tiny_qwen35()
    provider.linear_attention_freq = [1, 0]
    with pytest.raises(CudaGraphConfigError, match=r"model.linear_attention_freq=\[1, 0\].*model.num_layers=8"):
        model_facts(provider)


def test_the_moe_variant_reads_experts_and_the_hybrid_pattern():
    facts = model_facts(tiny_qwen35(moe=True))
    assert facts.num_moe_experts == 4
    assert facts.moe_layer_pattern == (1,) * 8
    assert facts.linear_attention_layers == (0, 1, 2, 4, 5, 6)


# -------------------------------------------------------------------------------------------------------- plan
@pytest.mark.parametrize("moe", [False, True])
def test_language_graphs_over_gated_delta_net_layers_are_refused_in_one_line(moe):
    cfg = qwen35_config(language=True, moe=moe)
    with pytest.raises(CudaGraphConfigError) as refused:
        plan_config(cfg, world_size=1, copy=True)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("model.cuda_graph.language.enabled=true on CudaGraphQwen35VL")
    assert "6 of its 8 decoder layers are gated-delta-net layers" in message
    assert refused.value.fix == ("model.cuda_graph.language.enabled=false",)


def test_following_the_fix_plans_vision_graphs_and_an_eager_decoder():
    cfg = qwen35_config(language=True)
    cfg.model.cuda_graph = cuda_graph_config_from_dict(
        {"language": {"enabled": False}, "vision": {"enabled": True}}, "model.cuda_graph"
    )
    plan = plan_config(cfg, world_size=1, copy=True)
    assert not plan.language.enabled and plan.vision is not None and plan.vision.enabled
    assert plan.facts.linear_attention_layers == (0, 1, 2, 4, 5, 6)
    text = describe_plan(plan)
    assert text.startswith("capture plan: CudaGraphQwen35VLModelProvider on 1 rank, bf16")
    assert "language: graphs off (8 layers run eagerly)" in text
    assert "each budget's graphs span layers 0-1" in text  # no deepstack layer cuts the encoder


def test_multi_token_prediction_stays_refused_under_explicit_groups():
    """Bridge's Qwen3.5-VL recipes turn MTP on; megatron-core's MTP asks ``parallel_state`` for its stage."""
    cfg = qwen35_config(language=False, mtp_num_layers=1)
    assert cfg.dist.use_decentralized_pg
    with pytest.raises(CudaGraphConfigError, match=r"^model.mtp_num_layers=1 with dist.use_decentralized_pg=true"):
        plan_config(cfg, world_size=1, copy=True)


def test_a_hybrid_model_needs_the_linear_attention_kernels_to_be_built():
    cfg = qwen35_config(language=False)
    if linear_attention_kernels_available():
        check_stack(cfg)
    else:
        with pytest.raises(CudaGraphConfigError, match=r"install flash-linear-attention$"):
            check_stack(cfg)
    check_linear_attention_kernels(tiny_qwen3_vl_config().model)  # no linear attention, nothing to refuse


@pytest.mark.parametrize(
    ("capability", "triton", "tilelang", "environ", "refused"),
    [
        ((9, 0), "3.6.0", False, {}, True),  # an H100/H200 with torch 2.11's Triton
        ((9, 0), "3.6.0+git4e3a1b2", False, {}, True),
        ((9, 0), "3.4.0", False, {}, True),
        ((9, 0), "3.7.1", False, {}, False),  # FLA's fixed Triton
        ((9, 0), "3.3.1", False, {}, False),  # before the regression
        ((8, 0), "3.6.0", False, {}, False),  # not Hopper
        ((10, 0), "3.6.0", False, {}, False),
        ((9, 0), "3.6.0", True, {}, False),  # FLA's TileLang backend takes the kernel
        ((9, 0), "3.6.0", True, {"FLA_TILELANG": "0"}, True),  # ... unless switched off
        (None, "3.6.0", False, {}, False),  # no GPU: nothing to say
    ],
)
def test_fla_refuses_the_gated_delta_backward_on_hopper_with_the_broken_triton(
    capability, triton, tilelang, environ, refused
):
    """FLA 0.5.2's ``chunk_bwd_dqkwg`` raises on Hopper with Triton >= 3.4.0 and < 3.7.1 without TileLang (the
    first backward of a gated-delta-net layer, deep in the step); the plan's probe says so before the first step,
    with the versions that pass."""
    from bridge_cudagraph.host.compat import linear_attention_backward_refusal

    why = linear_attention_backward_refusal(capability, triton, tilelang, environ)
    assert (why is not None) == refused, why
    if refused:
        assert why.startswith(f"Triton {triton} on a Hopper GPU") and "3.7.1" in why, why


def test_train_refuses_a_hybrid_model_whose_fla_would_refuse_the_backward(monkeypatch):
    """The wiring of that probe into ``check_stack``: where FLA is installed and would refuse the backward, one
    ``error:`` line names the setting and the three ways out; deterministic mode (megatron-core's torch rule) passes.
    This machine has neither FLA nor a Hopper GPU, so both answers are given to the check."""
    from bridge_cudagraph.host import compat

    why = compat.linear_attention_backward_refusal((9, 0), "3.6.0", False, {})
    monkeypatch.setattr(compat, "linear_attention_kernels_available", lambda: True)
    monkeypatch.setattr(compat, "machine_linear_attention_backward_refusal", lambda: why)
    with pytest.raises(CudaGraphConfigError) as refused:
        check_stack(qwen35_config(language=False))
    line = str(refused.value)
    assert line.startswith("model.experimental_attention_variant='gated_delta_net' trains"), line
    assert "Triton 3.6.0 on a Hopper GPU" in line and "install tilelang" in line, line
    assert "model.deterministic_mode=true" in line and "\n" not in line, line
    check_stack(qwen35_config(language=False, deterministic_mode=True))
    check_stack(tiny_qwen3_vl_config())  # no linear attention: nothing to refuse
