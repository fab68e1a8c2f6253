"""``bridge_cudagraph.plan``: plans built from plain numbers (no provider, no GPU), the expected graph counts and
static shapes for Qwen3-VL 8B at 8 and 64 GPUs, and every refusal of ``build_plan`` with its arithmetic."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

from bridge_cudagraph.config import (
    FORWARD_PARTS,
    CudaGraphConfig,
    CudaGraphConfigError,
    ForwardConfig,
    cuda_graph_config_from_dict,
)
from bridge_cudagraph.parallel.layout import LayoutError
from bridge_cudagraph.plan.budgets import derive_token_budgets
from bridge_cudagraph.plan.build import build_plan
from bridge_cudagraph.plan.capture_plan import CachedWalksPlan, CapturePlan, ForwardPlan
from bridge_cudagraph.plan.facts import ModelFacts, VisionFacts, model_facts

pytestmark = pytest.mark.fast

#: The derived vision ladder of Qwen3-VL 8B at seq 4096, micro-batch 2 (bound 4096 x 2**2 x 2 = 32768 patches).
VISION_8B_LADDER = (
    *(512, 576, 704, 832, 1024, 1280, 1536, 1920, 2368, 2944, 3648),
    *(4544, 5632, 6976, 8704, 10816, 13504, 16832, 20992, 26240, 32768),
)

QWEN3_VL_VISION = VisionFacts(
    depth=27,
    hidden_size=1152,
    num_heads=16,
    patch_size=16,
    temporal_patch_size=2,
    spatial_merge_size=2,
    deepstack_visual_indexes=(8, 16, 24),
    num_position_embeddings=2304,
)


def qwen3_vl_8b(**changes) -> ModelFacts:
    """Qwen3-VL 8B as Bridge's SFT recipe builds it: TP 2, seq 4096, mRoPE, bf16."""
    facts = ModelFacts(
        provider="CudaGraphQwen3VLModelProvider",
        num_layers=36,
        hidden_size=4096,
        num_attention_heads=32,
        kv_channels=128,
        seq_length=4096,
        tp=2,
        position_embedding_type="mrope",
        vision=QWEN3_VL_VISION,
    )
    return dataclasses.replace(facts, **changes)


def qwen3_8b(**changes) -> ModelFacts:
    """Qwen3 8B (GPT family, standard RoPE): TP 4, seq 2048."""
    facts = ModelFacts(
        provider="CudaGraphGPTModelProvider",
        num_layers=36,
        hidden_size=4096,
        num_attention_heads=32,
        kv_channels=128,
        seq_length=2048,
        tp=4,
        position_embedding_type="rope",
    )
    return dataclasses.replace(facts, **changes)


def both_on(**vision) -> CudaGraphConfig:
    return cuda_graph_config_from_dict({"language": {"enabled": True}, "vision": {"enabled": True, **vision}})


LANGUAGE_ON = cuda_graph_config_from_dict({"language": {"enabled": True}})


def texts(inputs) -> tuple[str, ...]:
    """The static inputs as ``bridge-cudagraph plan`` prints them."""
    return tuple(s.describe() for s in inputs)


def plan(facts: ModelFacts, cfg: CudaGraphConfig, world: int = 8, mbs: int = 2, gbs: int | None = 128) -> CapturePlan:
    return build_plan(facts, cfg, world_size=world, micro_batch_size=mbs, global_batch_size=gbs)


# world size -> (language dp, micro-batches per step, vision dp)
QWEN3_VL_8B_AT = {8: (4, 16, 8), 64: (32, 2, 64)}


class TestQwen3VL8B:
    @pytest.mark.parametrize("world", sorted(QWEN3_VL_8B_AT))
    def test_expected_numbers(self, world):
        """Layouts, micro-batches, graph counts, budgets and static shapes of the 8B recipe (mbs 2, gbs 128)."""
        dp, num_mb, vision_dp = QWEN3_VL_8B_AT[world]
        p = plan(qwen3_vl_8b(), both_on(), world=world)
        assert (p.language_layout.tp, p.language_layout.dp, p.language_layout.pp) == (2, dp, 1)
        assert (p.vision_layout.tp, p.vision_layout.dp, p.vision_layout.rank_offset) == (1, vision_dp, 0)
        assert p.num_microbatches == num_mb
        assert p.language.layers_per_stage == (36,) and p.language.captured_per_stage == (36,)
        # Deepstack merges after language layers 0, 1, 2 cut the decoder into runs 0, 1, 2 and 3-35: 4 graphs.
        assert p.language.graph_unit == "run" and p.language.deepstack_merges == 3
        assert p.language.segments_per_stage == (((0, 1), (1, 2), (2, 3), (3, 36)),)
        assert p.language.graphs_per_unit == 1 and p.language.graphs == 4
        assert [(s.name, s.shape, s.dtype) for s in p.language.static_inputs] == [
            ("hidden_states", (4096, 2, 4096), "bf16"),
            ("rotary_pos_emb", (4096, 2, 1, 128), "fp32"),
        ]
        # Whole dense layers of padded rows: the ladder engine, one rung; no attention mask (causal layers).
        assert p.language.padded is not None and p.language.padded.token_budgets == (2 * 4096,)
        assert texts(p.language.static_inputs) == (
            "hidden_states (S/cp=4096, mbs=2, H=4096) bf16",
            "rotary_pos_emb (S/cp=4096, mbs=2, 1, 128) fp32 (mRoPE)",
        )
        v = p.vision
        # A geometric ladder from 32768 // 64 = 512 up to the bound, multiples of 64 patches, <= 1.25x apart.
        assert v.token_budgets == VISION_8B_LADDER and v.budgets_derived
        assert v.max_patches_per_microbatch == 4096 * 4 * 2
        assert v.max_images_per_microbatch == 32768 // (4 * 16) == 512 and v.images_derived
        # Deepstack layers 8, 16, 24 of 27 cut the stack into layers 0-8, 9-16, 17-24, 25-26: 4 graphs per budget.
        assert v.graph_unit == "run" and v.segments == ((0, 9), (9, 17), (17, 25), (25, 27))
        assert v.graphs_per_budget == 4 and v.graphs == 4 * 21 == 84
        assert [(s.name, s.shape, s.dtype) for s in v.inputs_at(4544)] == [
            ("hidden_states", (4544, 1, 1152), "bf16"),
            ("rotary_pos_emb", (4544, 1, 1, 72), "fp32"),
            ("cu_seqlens", (514,), "int32"),
        ]
        assert texts(v.inputs_at(4544)) == (
            "hidden_states (4544, 1, 1152) bf16",
            "rotary_pos_emb (4544, 1, 1, 72) fp32",
            "cu_seqlens (514,) int32",
        )
        assert p.total_graphs == 4 + 84

    def test_one_graph_per_layer_when_asked(self):
        """``graph_unit: layer``: one graph per layer per budget, and the plan says so."""
        p = plan(qwen3_vl_8b(), both_on(graph_unit="layer"))
        assert p.vision.graph_unit == "layer" and p.vision.graphs == 27 * 21 == 567
        lines = p.describe().splitlines()
        assert any(line.startswith("vision: 27 layers x 21 budgets = 567 graphs per rank") for line in lines)

    def test_language_runs_per_pipeline_stage(self):
        """Only the first stage merges deepstack features: its runs are cut there, the later stages' are not."""
        p = plan(qwen3_vl_8b(pp=2), both_on(), world=8, mbs=2, gbs=128)
        assert p.language.segments_per_stage == (((0, 1), (1, 2), (2, 3), (3, 18)), ((0, 18),))
        lines = p.describe().splitlines()
        first = "  runs of layers: 0, 1, 2, 3-17 on stage 0; cut after each of the first 3 (a deepstack merge follows)"
        assert first in lines
        assert "  runs of layers: 0-17 on stage 1; nothing runs between the layers" in lines

    def test_one_language_graph_per_layer_when_asked(self):
        """``language.graph_unit: layer``: megatron-core's unit, one graph per layer, and the plan says so."""
        cfg = cuda_graph_config_from_dict({"language": {"enabled": True, "graph_unit": "layer"}})
        p = plan(qwen3_vl_8b(), cfg)
        assert p.language.graph_unit == "layer" and p.language.graphs == 36
        assert p.language.segments_per_stage == (tuple((i, i + 1) for i in range(36)),)
        lines = p.describe().splitlines()
        i = lines.index("language: 36 layers x 1 graph each (pp 1) = 36 graphs per rank,")
        assert lines[i + 1] == "  whole layers, capture after 3 steps (model.cuda_graph_warmup_steps)"
        assert not any("runs of layers" in line or "graph_unit null" in line for line in lines)

    @pytest.mark.fast
    def test_language_runs_fall_back_to_layers_on_moe_layers(self):
        """MoE layers: null means one graph per layer; an explicit ``run`` there is refused with the reason and the
        fix."""
        runs = cuda_graph_config_from_dict({"language": {"enabled": True, "graph_unit": "run"}})
        facts = qwen3_vl_8b(num_moe_experts=8, moe_layer_pattern=(1,) * 36)
        assert plan(facts, LANGUAGE_ON, mbs=1, gbs=32).language.graph_unit == "layer"
        with pytest.raises(CudaGraphConfigError, match="MoE layers") as info:
            plan(facts, runs, mbs=1, gbs=32)
        assert "graph_unit='run'" in str(info.value) and "set it to 'layer'" in str(info.value)

    @pytest.mark.fast
    def test_what_the_ladder_does_not_capture_is_refused_with_its_fix(self):
        """One language engine, the ladder: parts of dense layers, a virtual pipeline and a per-layer quantization
        context are refused, each naming the setting and a fix that plans."""
        partial = {"language": {"enabled": True, "modules": ["attn"]}}
        router = {"language": {"enabled": True, "modules": ["attn", "moe_router", "moe_preprocess"]}}
        moe = qwen3_vl_8b(num_moe_experts=8, moe_layer_pattern=(1,) * 36)
        cases = [
            (qwen3_8b(), partial, "modules=['attn'] captures parts of", "model.cuda_graph.language.modules=null"),
            (moe, router, "of each MoE layer its attention alone", "model.cuda_graph.language.modules=null"),
            (
                qwen3_8b(tp=2, pp=2, virtual_pipeline_size=2),
                {"language": {"enabled": True}},
                "one model chunk per rank",
                "model.virtual_pipeline_model_parallel_size=null",
            ),
            (
                qwen3_8b(per_layer_contexts=("fp8",)),
                {"language": {"enabled": True}},
                "model.fp8 is set",
                "model.fp8=null",
            ),
            (
                qwen3_8b(per_layer_contexts=("fp4",)),
                {"language": {"enabled": True}},
                "model.fp4 is set",
                "model.fp4=null",
            ),
        ]
        for facts, block, reason, fix in cases:
            with pytest.raises(CudaGraphConfigError, match=re.escape(reason)) as info:
                plan(facts, cuda_graph_config_from_dict(block), mbs=1, gbs=32)
            assert fix in info.value.fix
        # Activation offloading: the plan gives the line the CLI gives before Bridge's checks, word for word.
        from types import SimpleNamespace

        from bridge_cudagraph.plan.checks import ACTIVATION_OFFLOADING, check_activation_offloading

        for name in ACTIVATION_OFFLOADING:
            with pytest.raises(CudaGraphConfigError) as planned:
                plan(qwen3_8b(per_layer_contexts=(name,)), LANGUAGE_ON, mbs=1, gbs=32)
            with pytest.raises(CudaGraphConfigError) as before_bridge:
                check_activation_offloading(SimpleNamespace(**{name: True}))
            assert str(planned.value) == str(before_bridge.value) and planned.value.fix == (f"model.{name}=false",)
        # The MoE attention scope given explicitly is null's scope, and the vision graphs alone are not refused.
        assert plan(moe, cuda_graph_config_from_dict(partial), mbs=1, gbs=32).language.modules == ("attn",)
        vision_only = cuda_graph_config_from_dict({"vision": {"enabled": True}})
        assert plan(qwen3_vl_8b(per_layer_contexts=("fp8",)), vision_only, mbs=1, gbs=32).vision.enabled

    def test_given_budgets_are_kept(self):
        """Budgets from the recipe are used as given, with the images bound derived from the largest."""
        v = plan(qwen3_vl_8b(), both_on(token_budgets=[1024, 4096])).vision
        assert v.token_budgets == (1024, 4096) and not v.budgets_derived
        assert v.max_images_per_microbatch == 4096 // 64 and v.graphs == 2 * 4

    def test_given_image_bound_is_kept(self):
        """``max_images_per_microbatch`` sizes ``cu_seqlens`` (plus the leading 0 and the padding segment)."""
        v = plan(qwen3_vl_8b(), both_on(max_images_per_microbatch=8)).vision
        assert v.max_images_per_microbatch == 8 and not v.images_derived
        assert all(inputs[2].shape == (10,) and inputs[2].dtype == "int32" for _, inputs in v.static_inputs)

    def test_derived_budgets_are_the_capture_ladder(self):
        """The plan derives exactly the budgets the vision capture derives (``bridge_cudagraph.plan.budgets``)."""
        vision_only = cuda_graph_config_from_dict({"vision": {"enabled": True}})
        for seq, mbs in [(4096, 2), (256, 2), (4096, 1), (1000, 3)]:
            v = plan(qwen3_vl_8b(seq_length=seq), vision_only, mbs=mbs, gbs=None).vision
            assert list(v.token_budgets) == derive_token_budgets(seq, mbs, 2)

    def test_vision_tp_splits_the_stage(self):
        """Vision tp 2 on 8 GPUs: 4 vision dp groups of adjacent pairs (language tp pairs share images)."""
        p = plan(qwen3_vl_8b(), both_on(tensor_parallel_size=2))
        assert (p.vision_layout.tp, p.vision_layout.dp) == (2, 4)

    def test_graphs_off_still_resolves_the_vision_layout(self):
        """The encoder gets its own groups whether or not it is graphed."""
        p = plan(qwen3_vl_8b(), CudaGraphConfig())
        assert not p.language.enabled and not p.vision.enabled and p.vision_layout is not None
        assert p.language.graphs == 0 and p.vision.graphs == 0 and p.total_graphs == 0

    def test_plan_is_frozen(self):
        """What will be done cannot be changed after planning."""
        p = plan(qwen3_vl_8b(), both_on())
        with pytest.raises(dataclasses.FrozenInstanceError):
            p.num_microbatches = 3  # type: ignore[misc]
        assert not hasattr(p, "__dict__")  # slots


class TestVisionUnderPipeline:
    """Stage 0 of a 1F1B pipeline keeps min(pp, micro-batches) micro-batches in flight: one vision graph set each."""

    def test_copies_follow_the_in_flight_micro_batches(self):
        # 8 GPUs, tp 4 x pp 2 -> dp 1; gbs 8 / mbs 2 = 4 micro-batches; stage 0 holds 2 of them in flight.
        p = plan(qwen3_vl_8b(tp=4, pp=2), both_on(), gbs=8)
        assert p.num_microbatches == 4
        assert p.vision.copies == 2
        assert p.vision.graphs == 4 * len(p.vision.token_budgets) * 2
        assert "x 2 in-flight copies" in p.describe()

    def test_one_micro_batch_needs_one_copy(self):
        p = plan(qwen3_vl_8b(tp=4, pp=2), both_on(), gbs=2)
        assert p.num_microbatches == 1 and p.vision.copies == 1

    def test_no_pipeline_one_copy(self):
        p = plan(qwen3_vl_8b(), both_on())
        assert p.vision.copies == 1 and "in-flight" not in p.describe()


class TestLanguage:
    def test_gpt_rope_and_sequence_parallel_shapes(self):
        """Standard RoPE is one table for the batch; sequence parallel splits hidden_states over tp."""
        p = plan(qwen3_8b(sequence_parallel=True), LANGUAGE_ON, mbs=1, gbs=32)
        assert p.vision is None and len(p.layouts) == 1
        assert p.language.static_inputs[0].shape == (512, 1, 4096)
        assert texts(p.language.static_inputs) == (
            "hidden_states (S/cp/tp=512, mbs=1, H=4096) bf16",
            "rotary_pos_emb (S/cp=2048, 1, 1, 128) fp32",
        )
        assert p.num_microbatches == 32 // (1 * 2)

    def test_context_parallel_slices_the_sequence(self):
        """cp 2 halves the rows of every static input."""
        p = plan(qwen3_8b(cp=2, tp=2), LANGUAGE_ON, mbs=1, gbs=32)
        assert p.language.static_inputs[0].describe() == "hidden_states (S/cp=1024, mbs=1, H=4096) bf16"
        assert p.language.static_inputs[1].describe() == "rotary_pos_emb (S/cp=1024, 1, 1, 128) fp32"
        assert p.language.padded.width == 1024

    def test_pipeline_graphs_one_per_microbatch_in_flight(self):
        """With pp > 1 every layer needs one graph per micro-batch a stage keeps in flight (1F1B: pp at most) on the
        ladder."""
        p = plan(qwen3_8b(tp=2, pp=4), LANGUAGE_ON, world=8, mbs=1, gbs=32)
        assert p.language_layout.dp == 1 and p.num_microbatches == 32
        assert p.language.layers_per_stage == (9, 9, 9, 9)
        # A GPT stage merges nothing between its layers: one run of 9 layers, one graph per micro-batch.
        assert p.language.segments_per_stage == (((0, 9),),) * 4
        assert p.language.graphs_per_unit == 4 and p.language.graphs_per_stage == (4,) * 4
        per_layer = cuda_graph_config_from_dict({"language": {"enabled": True, "graph_unit": "layer"}})
        p = plan(qwen3_8b(tp=2, pp=4), per_layer, world=8, mbs=1, gbs=32)
        assert p.language.graphs_per_unit == 4 and p.language.graphs_per_stage == (36,) * 4

    def test_explicit_microbatch_count(self):
        """``num_microbatches`` is used when the global batch is unknown."""
        cfg = cuda_graph_config_from_dict({"language": {"enabled": True}, "num_microbatches": 6})
        p = plan(qwen3_8b(tp=2, pp=4), cfg, world=8, mbs=1, gbs=None)
        assert p.num_microbatches == 6 and p.language.graphs_per_stage == (4,) * 4

    def test_uneven_pipeline_split(self):
        """First/last stage sizes as Megatron-Core's ``get_num_layers_to_build`` places them."""
        facts = qwen3_8b(tp=2, pp=4, num_layers_in_first_pipeline_stage=8, num_layers_in_last_pipeline_stage=10)
        assert plan(facts, LANGUAGE_ON, mbs=1, gbs=32).language.layers_per_stage == (8, 9, 9, 10)

    def test_embedding_and_loss_count_as_layers(self):
        """``account_for_*_in_pipeline_split`` takes a layer off the first/last stage."""
        facts = qwen3_8b(
            num_layers=38,
            tp=2,
            pp=4,
            account_for_embedding_in_pipeline_split=True,
            account_for_loss_in_pipeline_split=True,
        )
        assert plan(facts, LANGUAGE_ON, mbs=1, gbs=32).language.layers_per_stage == (9, 10, 10, 9)


class TestModelFacts:
    def provider(self, **changes):
        fields = dict(
            num_layers=4,
            hidden_size=512,
            num_attention_heads=8,
            kv_channels=None,
            seq_length=256,
            tensor_model_parallel_size=2,
            context_parallel_size=1,
            pipeline_model_parallel_size=1,
            expert_model_parallel_size=1,
            expert_tensor_parallel_size=None,
            sequence_parallel=False,
            position_embedding_type="rope",
            num_moe_experts=None,
            moe_layer_freq=1,
            bf16=False,
            fp16=False,
        )
        fields.update(changes)
        return SimpleNamespace(**fields)

    def test_reads_a_provider(self):
        """Plain attribute reads; kv_channels defaults to hidden / heads."""
        f = model_facts(self.provider())
        assert (f.provider, f.num_layers, f.kv_channels, f.tp, f.etp, f.dtype, f.vision) == (
            "SimpleNamespace",
            4,
            64,
            2,
            2,
            "fp32",
            None,
        )

    def test_per_layer_contexts_are_the_set_ones(self):
        """fp8 (a recipe name when set), fp4, CPU offloading: the decoder wraps or follows each layer on its own."""
        assert model_facts(self.provider()).per_layer_contexts == ()
        f = model_facts(self.provider(fp8="hybrid", cpu_offloading=True, fp4=None))
        assert f.per_layer_contexts == ("fp8", "cpu_offloading")

    def test_expert_tp_follows_bridge(self):
        """Unset expert tp is 1 under expert parallelism (Bridge's default), else tp (Megatron-Core's)."""
        assert model_facts(self.provider(expert_model_parallel_size=4)).etp == 1
        assert model_facts(self.provider(expert_model_parallel_size=4, expert_tensor_parallel_size=2)).etp == 2

    @pytest.mark.parametrize(
        ("mixed_precision", "flags", "dtype"),
        [
            ("bf16_mixed", {}, "bf16"),
            ("fp16_with_fp8_delayed_scaling", {}, "fp16"),
            (SimpleNamespace(bf16=True, fp16=False), {}, "bf16"),
            (None, {"fp16": True}, "fp16"),
            (None, {"bf16": True}, "bf16"),
        ],
    )
    def test_dtype(self, mixed_precision, flags, dtype):
        """The ConfigContainer's mixed precision wins over the provider flags (Bridge applies it at validate)."""
        assert model_facts(self.provider(**flags), mixed_precision=mixed_precision).dtype == dtype

    @pytest.mark.parametrize(
        ("freq", "pattern"),
        [(1, (1, 1, 1, 1)), (2, (1, 0, 1, 0)), ([0, 1, 1, 0], (0, 1, 1, 0)), ("[0]*2+[1]*2", (0, 0, 1, 1))],
    )
    def test_moe_layer_freq(self, freq, pattern):
        """Megatron-Core's three spellings of ``moe_layer_freq``."""
        assert model_facts(self.provider(num_moe_experts=8, moe_layer_freq=freq)).moe_layer_pattern == pattern

    def test_moe_layer_freq_of_the_wrong_length(self):
        """A per-layer list must cover every layer."""
        with pytest.raises(CudaGraphConfigError, match=r"lists 3 layers but model\.num_layers is 4"):
            model_facts(self.provider(num_moe_experts=8, moe_layer_freq=[1, 1, 1]))

    def test_vision_config(self):
        """Qwen3-VL's HF vision config becomes :class:`VisionFacts`."""
        vision = SimpleNamespace(
            depth=27,
            hidden_size=1152,
            num_heads=16,
            patch_size=16,
            temporal_patch_size=2,
            spatial_merge_size=2,
            deepstack_visual_indexes=[8, 16, 24],
            num_position_embeddings=2304,
        )
        f = model_facts(self.provider(vision_config=vision))
        assert f.vision == QWEN3_VL_VISION and f.vision.head_dim == 72 and f.vision.merge_unit == 4


# (facts, cfg, build_plan kwargs, error type, fragments the message must contain)
ERRORS = [
    (qwen3_vl_8b(), both_on(token_budgets=[2, 8]), {}, CudaGraphConfigError, ["token_budgets[0]=2", "2**2 = 4"]),
    (
        qwen3_vl_8b(),
        both_on(token_budgets=[576, 1023]),
        {},
        CudaGraphConfigError,
        ["token_budgets[1]=1023", "1023 % 4 = 3", "round up to 1024", "merged-token units multiply by 4: 4092"],
    ),
    (
        qwen3_vl_8b(),
        both_on(tensor_parallel_size=3),
        {},
        LayoutError,
        ["model.cuda_graph.vision.tensor_parallel_size", "16 attention heads", "(16 % 3 = 1)", "[1, 2, 4, 8, 16]"],
    ),
    (qwen3_vl_8b(), both_on(tensor_parallel_size=16), {}, LayoutError, ["vision tp 16 does not divide the 8 ranks"]),
    (qwen3_vl_8b(tp=4), both_on(), {"world_size": 6}, LayoutError, ["= 4 does not divide world size 6"]),
    (
        qwen3_vl_8b(virtual_pipeline_size=2),
        CudaGraphConfig(),
        {},
        CudaGraphConfigError,
        ["virtual_pipeline_model_parallel_size=2 with Qwen3-VL"],
    ),
    (
        qwen3_vl_8b(),
        both_on(),
        {"global_batch_size": 100},
        CudaGraphConfigError,
        ["global_batch_size 100 is not divisible by micro batch 2 x dp 4 = 8 (100 % 8 = 4)", "multiple of 8"],
    ),
    (qwen3_vl_8b(), both_on(), {"global_batch_size": None}, CudaGraphConfigError, ["global_batch_size is unset"]),
    (
        qwen3_vl_8b(),
        cuda_graph_config_from_dict({"language": {"enabled": True}, "num_microbatches": 4}),
        {},
        CudaGraphConfigError,
        ["num_microbatches=4 but train.global_batch_size 128 / (micro batch 2 x dp 4) = 16"],
    ),
    (qwen3_8b(), both_on(), {}, CudaGraphConfigError, ["vision.enabled=true but", "no vision encoder"]),
    (
        qwen3_8b(seq_length=2050, sequence_parallel=True),
        LANGUAGE_ON,
        {},
        CudaGraphConfigError,
        ["model.seq_length 2050 is not divisible by cp 1 x tp 4 (sequence parallel) = 4 (2050 % 4 = 2)"],
    ),
    (
        qwen3_8b(tp=2, pp=5, num_layers=36),
        LANGUAGE_ON,
        {"world_size": 10, "global_batch_size": 10},
        CudaGraphConfigError,
        ["num_layers 36 is not divisible by model.pipeline_model_parallel_size 5 (36 % 5 = 1)"],
    ),
    (
        qwen3_8b(tp=2, pp=4, num_layers_in_first_pipeline_stage=7),
        LANGUAGE_ON,
        {"global_batch_size": 32},
        CudaGraphConfigError,
        ["leaves 29 layers for 3 middle stages (29 % 3 = 2)"],
    ),
    (
        qwen3_8b(has_pipeline_layout=True, tp=2, pp=2),
        LANGUAGE_ON,
        {},
        CudaGraphConfigError,
        ["pipeline_model_parallel_layout"],
    ),
    (
        dataclasses.replace(qwen3_8b(num_moe_experts=8), moe_layer_pattern=(1,) * 36),
        cuda_graph_config_from_dict({"language": {"enabled": True, "modules": ["mlp"]}}),
        {},
        CudaGraphConfigError,
        ["modules=['mlp'] captures parts of", "of each MoE layer its attention alone"],
    ),
    (qwen3_8b(), LANGUAGE_ON, {"world_size": 0}, CudaGraphConfigError, ["world size must be a positive integer"]),
    (qwen3_8b(), LANGUAGE_ON, {"micro_batch_size": 0}, CudaGraphConfigError, ["train.micro_batch_size"]),
    (qwen3_8b(), cuda_graph_config_from_dict({"on_capture_error": "raise"}), {"world_size": 3}, LayoutError, ["3"]),
]


@pytest.mark.parametrize(("facts", "cfg", "kwargs", "error", "fragments"), ERRORS, ids=range(len(ERRORS)))
def test_build_plan_refuses(facts, cfg, kwargs, error, fragments):
    """Every refusal names the setting and shows its arithmetic."""
    arguments = {"world_size": 8, "micro_batch_size": 2, "global_batch_size": 128, **kwargs}
    with pytest.raises(error) as info:
        build_plan(facts, cfg, **arguments)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


class TestDescribe:
    def test_block_for_the_8b_recipe(self):
        """The readable block: header, layout tables, language and vision lines, at most 119 columns."""
        text = plan(qwen3_vl_8b(), both_on()).describe()
        lines = text.splitlines()
        assert lines[0] == "capture plan: CudaGraphQwen3VLModelProvider on 8 ranks, bf16"
        assert lines[1] == "  micro-batch 2, global batch 128, micro-batches per step 16 (128 / (2 x dp 4))"
        assert "language: ranks 0-7 of 8" in lines and "vision: ranks 0-7 of 8" in lines
        i = lines.index("language: 36 layers in 4 runs x 1 graph each (pp 1) = 4 graphs per rank,")
        assert lines[i + 1] == "  whole layers, capture after 3 steps (model.cuda_graph_warmup_steps)"
        assert "  runs of layers: 0, 1, 2, 3-35; cut after each of the first 3 (a deepstack merge follows)" in lines
        vision = "vision: 4 graphs x 21 budgets = 84 graphs per rank"
        assert any(line.startswith(vision) for line in lines)
        assert "  each budget's graphs span layers 0-8, 9-16, 17-24, 25-26 (cut after each deepstack layer)" in lines
        j = lines.index(
            "  budgets [512, 576, 704, 832, 1024, 1280, 1536, 1920, 2368, 2944, 3648, 4544, 5632, 6976, 8704, 10816, "
            "13504, 16832,"
        )
        assert lines[j + 1] == "    20992, 26240, 32768] patches"
        assert lines[j + 2] == "    derived: S 4096 x 2**2 x mbs 2 = 32768 max, 21 rungs <= 1.25x apart"
        k = lines.index("  static inputs at B=32768 (each budget the same with its own B):")
        assert lines[k + 1 : k + 4] == [
            "    hidden_states (32768, 1, 1152) bf16",
            "    rotary_pos_emb (32768, 1, 1, 72) fp32",
            "    cu_seqlens (514,) int32",
        ]
        assert lines[-1].startswith("busiest rank: 88 graphs")
        assert max(map(len, lines)) <= 119 and not text.endswith("\n")

    @pytest.mark.parametrize("world", [1, 8, 64, 512])
    def test_lines_fit_the_log_width(self, world):
        """Any world size and budget list stays within 119 columns."""
        facts = qwen3_vl_8b(tp=1 if world == 1 else 2, seq_length=32768)
        text = plan(facts, both_on(), world=world, gbs=2 * world).describe()
        assert max(map(len, text.splitlines())) <= 119

    def test_each_cached_walk_follows_the_graphs_unless_turned_off(self):
        """Each walk done once wherever graphs are (the default), each off on its own with its ``false`` and both with
        graphs off; the plan says which, above the busiest-rank line."""
        on = plan(qwen3_vl_8b(), both_on())
        assert (on.cached_walks.optimizer, on.cached_walks.grad_finalize) == (True, True)
        line = "optimizer: the step's per-parameter and per-module host work cached (same kernels, same step)"
        assert line in on.describe()
        lang = {"language": {"enabled": True}}
        texts = {}
        for walks in ({"optimizer": False}, {"grad_finalize": False}, {"optimizer": False, "grad_finalize": False}):
            off = plan(qwen3_8b(), cuda_graph_config_from_dict({**lang, "cached_walks": walks}))
            for walk in ("optimizer", "grad_finalize"):
                assert getattr(off.cached_walks, walk) is (walk not in walks), (walks, walk)
            text = off.describe()
            assert all(f"cached_walks.{walk}=false" in text for walk in walks) and line not in text
            texts[tuple(walks)] = text
        assert len(set(texts.values())) == 3
        both = (
            "optimizer: megatron-core's step as it is (cached_walks.optimizer=false, cached_walks.grad_finalize=false)"
        )
        assert both in texts[("optimizer", "grad_finalize")].splitlines()
        no_graphs = plan(qwen3_vl_8b(), CudaGraphConfig())
        assert no_graphs.cached_walks == CachedWalksPlan() and "optimizer:" not in no_graphs.describe()

    def test_each_forward_part_follows_the_graphs_on_qwen3_vl_unless_turned_off(self):
        """Each part on wherever graphs are on a Qwen3-VL model (the default), off on its own with its ``false``, all
        off with graphs off and on a text-only model, where ``true`` is refused; the plan says which, below the
        optimizer line."""
        on = plan(qwen3_vl_8b(), both_on())
        assert on.forward.parts == FORWARD_PARTS and on.forward.off_reasons == ()
        lines = on.describe().splitlines()
        assert lines[lines.index(next(x for x in lines if x.startswith("optimizer:"))) + 1].startswith(
            "forward: mRoPE positions from one host copy, deepstack and image-token merges by index"
        )
        for part in FORWARD_PARTS:
            block = cuda_graph_config_from_dict({"language": {"enabled": True}, "forward": {part: False}})
            off = plan(qwen3_vl_8b(), block)
            assert not getattr(off.forward, part), part
            gone = {part, "flat_rows"} if part == "positions" else {part}  # the flat rows carry the positions
            assert set(off.forward.parts) == set(FORWARD_PARTS) - gone, part
            assert (part, f"forward.{part}=false") in off.forward.off_reasons
            assert f"forward.{part}=false" in off.describe()
        block = {"language": {"enabled": True}, "forward": dict.fromkeys(FORWARD_PARTS, False)}
        bridge = plan(qwen3_vl_8b(), cuda_graph_config_from_dict(block))
        assert bridge.forward.parts == () and "forward: Bridge's Qwen3-VL forward as it is:" in bridge.describe()
        gpt = plan(qwen3_8b(), cuda_graph_config_from_dict({"language": {"enabled": True}}))
        assert gpt.forward == ForwardPlan() and "forward:" not in gpt.describe()
        assert plan(qwen3_vl_8b(), CudaGraphConfig()).forward == ForwardPlan()
        for part in FORWARD_PARTS:
            block = cuda_graph_config_from_dict({"language": {"enabled": True}, "forward": {part: True}})
            with pytest.raises(CudaGraphConfigError, match=rf"forward\.{part}=true but .* is not Qwen3-VL"):
                plan(qwen3_8b(), block)

    def test_the_flat_rows_follow_the_positions(self):
        """``flat_rows`` null with ``positions: false`` is off, and says why; ``true`` against it is refused by the
        block with the fix that turns the positions back on."""
        block = cuda_graph_config_from_dict({"language": {"enabled": True}, "forward": {"positions": False}})
        p = plan(qwen3_vl_8b(), block)
        assert (
            not p.forward.flat_rows
            and ("flat_rows", "needs forward.positions, which is false") in p.forward.off_reasons
        )
        with pytest.raises(CudaGraphConfigError, match=r"flat_rows=true .*forward\.positions is false") as info:
            cuda_graph_config_from_dict(
                {"language": {"enabled": True}, "forward": {"positions": False, "flat_rows": True}}, "model.cuda_graph"
            )
        assert info.value.fix == ("model.cuda_graph.forward.positions=null",)

    def test_the_weight_gradient_line_follows_the_providers_fusion(self):
        """Above the busiest-rank line: where the weight gradients are summed, as the provider's
        ``gradient_accumulation_fusion`` says (TE's GEMMs with it, one addition per parameter without)."""
        import dataclasses

        def line(p, prefix):
            lines = p.describe().splitlines()
            i = next(i for i, x in enumerate(lines) if x.startswith(prefix))
            return lines[i], lines[i + 1]

        unfused, vision = line(plan(qwen3_vl_8b(), both_on()), "weight gradients:")
        assert unfused.startswith("weight gradients: added to main_grad") and "=false" in unfused
        assert vision == "  vision encoder: one at a time, as Bridge builds it (its config leaves the fusion off)"
        fused = plan(dataclasses.replace(qwen3_vl_8b(), gradient_accumulation_fusion=True), both_on())
        assert line(fused, "weight gradients:")[0].startswith("weight gradients: summed in the language TE layers")
        gpt = line(plan(qwen3_8b(), LANGUAGE_ON), "weight gradients:")
        assert "vision encoder" not in gpt[1]

    def test_graphs_off_and_pipeline_lines(self):
        """Off submodules say so; a pipeline lists its stages."""
        off = plan(qwen3_vl_8b(), CudaGraphConfig()).describe()
        assert "language: graphs off (36 layers run eagerly)" in off and "vision: graphs off" in off
        assert "busiest rank" not in off
        cfg = cuda_graph_config_from_dict({"language": {"enabled": True}, "on_capture_error": "raise"})
        pipe = plan(qwen3_8b(tp=2, pp=4), cfg, mbs=1, gbs=32).describe()
        assert (
            "language: 9+9+9+9 layers on 4 stages in 1+1+1+1 runs x 4 graphs each (in flight)" in (pipe)
            and "stops" in pipe
        )
        assert "  runs of layers: 0-8 on stage 0; nothing runs between the layers" in pipe.splitlines()
        assert max(map(len, pipe.splitlines())) <= 119


def test_planning_imports_no_torch():
    """``plan`` (with ``layout``, ``budgets`` and ``config``) is pure: it imports neither torch nor Megatron."""
    code = (
        "import sys, bridge_cudagraph.plan.build, bridge_cudagraph.plan.describe; "
        "sys.exit(any(m in sys.modules for m in ('torch', 'megatron')))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# ------------------------------------------------------------------------------------------ packed language graphs
def _packed_plan(packing: str | None = "qwen3_vl_step", **language):
    from bridge_cudagraph.config import CudaGraphConfig, LanguageGraphConfig
    from bridge_cudagraph.plan.build import build_plan
    from bridge_cudagraph.plan.facts import ModelFacts, PackingFacts, VisionFacts

    vision = VisionFacts(
        depth=4, hidden_size=256, num_heads=4, patch_size=16, temporal_patch_size=2, spatial_merge_size=2
    )
    facts = ModelFacts(
        provider="CudaGraphQwen3VLModelProvider",
        num_layers=4,
        hidden_size=512,
        num_attention_heads=8,
        kv_channels=64,
        seq_length=2048,
        position_embedding_type="mrope",
        **{"vision": vision, **language.pop("facts", {})},
    )
    positions = language.pop("forward_positions", None)
    cfg = CudaGraphConfig(language=LanguageGraphConfig(enabled=True, **language))
    cfg.forward.positions = positions
    world = facts.tp * facts.cp * facts.pp
    return build_plan(
        facts,
        cfg,
        world_size=world,
        micro_batch_size=2,
        global_batch_size=2,
        packing=None if packing is None else PackingFacts(packing),
    )


def test_packed_plan_derives_a_ladder_the_sequence_cap_and_static_shapes():
    plan = _packed_plan()
    packed = plan.language.packed
    assert packed is not None and plan.language.static_inputs == ()
    assert packed.token_budgets[-1] == 2 * 2048 and packed.max_seqlen == 2048 and packed.max_sequences == 2
    # No deepstack merge in these facts: the 4 layers are one run, one graph per budget.
    assert plan.language.graphs == 1 * len(packed.token_budgets)
    taps = _packed_plan(facts={"vision": dataclasses.replace(plan.facts.vision, deepstack_visual_indexes=(1, 2))})
    assert taps.language.segments_per_stage == (((0, 1), (1, 2), (2, 4)),)
    assert taps.language.graphs == 3 * len(packed.token_budgets)
    per_layer = _packed_plan(graph_unit="layer")
    assert per_layer.language.graphs == 4 * len(packed.token_budgets)
    _, inputs = packed.static_inputs[-1]
    shapes = {x.name: x.shape for x in inputs}
    assert shapes == {
        "hidden_states": (4096, 1, 512),
        "rotary_pos_emb": (4096, 1, 1, 64),
        "cu_seqlens": (1 + 2 + 2,),
        "cu_seqlens_padded": (1 + 2 + 2,),
    }
    assert "packed THD" in plan.describe()
    assert all(len(line) <= 119 for line in plan.describe().splitlines())


def test_packed_plan_takes_given_budgets_and_refuses_what_it_cannot_replay():
    from bridge_cudagraph.config import CudaGraphConfigError

    assert _packed_plan(token_budgets=[1024, 4096]).language.packed.token_budgets == (1024, 4096)
    with pytest.raises(CudaGraphConfigError, match="context_parallel_size=2"):
        _packed_plan(facts={"cp": 2})
    with pytest.raises(CudaGraphConfigError, match="modules"):
        _packed_plan(modules=["attn"])
    with pytest.raises(CudaGraphConfigError, match=r"multiples of tp 2"):
        _packed_plan(token_budgets=[1023], facts={"tp": 2, "sequence_parallel": True})


MOE_FACTS = {"num_moe_experts": 8, "moe_layer_pattern": (1, 0, 1, 1)}  # layer 1 dense (moe_layer_freq)


def test_packed_moe_plan_derives_the_attention_scope_and_says_so():
    """``modules: null`` on packed rows of an MoE model is the attention alone (the MLP half runs eagerly on the
    micro-batch's own tokens): one graph per layer, per budget, the dense packed layers' static inputs and nothing
    else, and the plan's text names the scope and its source."""
    plan = _packed_plan(facts=MOE_FACTS)
    language, packed = plan.language, plan.language.packed
    assert language.modules == ("attn",)
    assert language.modules_source == "null on MoE layers"
    assert language.graph_unit == "layer" and language.segments_per_stage == (((0, 1), (1, 2), (2, 3), (3, 4)),)
    assert language.graphs == 4 * len(packed.token_budgets)
    for _, inputs in packed.static_inputs:
        assert [x.name for x in inputs] == [
            "hidden_states",
            "rotary_pos_emb",
            "cu_seqlens",
            "cu_seqlens_padded",
        ]
    text = plan.describe()
    assert "[attn] (null on MoE layers)" in text
    assert "one graph per layer (graph_unit null: each MoE layer's MLP half runs eagerly after its graph)" in text
    assert "  MoE layers: each graph holds the attention; router, dispatch, experts and combine run eagerly" in text
    assert "padding_mask" not in text
    assert all(len(line) <= 119 for line in text.splitlines())
    # Tight packing would drop each row's padding, which Bridge's step routes and the router's losses count.
    assert not packed.tight and "MoE routing losses count each row's padding" in packed.tight_source
    assert _packed_plan().language.packed.tight  # the same facts without experts pack tightly
    # The scope given explicitly is the same plan, without the source.
    given = _packed_plan(modules=["attn"], facts=MOE_FACTS)
    assert given.language.modules == language.modules and given.language.modules_source == ""
    assert given.language.packed == packed


def test_padded_moe_plan_puts_the_attention_scope_on_the_ladder():
    """Padded rows of an MoE model with ``modules: null`` replay on the ladder as the packed ones do: one graph per
    layer holding each MoE layer's attention (its MLP half eager after it), one rung of the micro-batch's shape, no
    megatron-core helper."""
    plan = _packed_plan(packing=None, facts=MOE_FACTS)
    language = plan.language
    assert language.modules == ("attn",) and language.modules_source == "null on MoE layers"
    assert language.packed is None and language.padded is not None
    assert language.padded.token_budgets == (2 * 2048,) and language.padded.copies == 1
    assert language.graph_unit == "layer" and language.segments_per_stage == (((0, 1), (1, 2), (2, 3), (3, 4)),)
    assert language.graphs == 4
    assert [x.name for x in language.static_inputs] == ["hidden_states", "rotary_pos_emb"]
    text = plan.describe()
    assert "[attn] (null on MoE layers)" in text and "TECudaGraphHelper" not in text
    given = _packed_plan(packing=None, modules=["attn"], facts=MOE_FACTS)
    assert given.language.padded == language.padded and given.language.modules_source == ""


@pytest.mark.parametrize(
    ("modules", "fragment"),
    [
        (["attn", "moe"], "of each MoE layer its attention alone"),
        (["attn", "moe_router"], "of each MoE layer its attention alone"),
        (["attn", "moe_router", "moe_preprocess"], "of each MoE layer its attention alone"),
    ],
)
def test_packed_moe_plan_refuses_other_scopes_with_modules_null(modules, fragment):
    from bridge_cudagraph.config import CudaGraphConfigError

    with pytest.raises(CudaGraphConfigError, match=fragment) as info:
        _packed_plan(modules=modules, graph_unit="layer", facts=MOE_FACTS)
    assert info.value.fix == ("model.cuda_graph.language.modules=null",)


def test_packed_moe_on_offline_rows_is_refused():
    from bridge_cudagraph.config import CudaGraphConfigError

    with pytest.raises(CudaGraphConfigError, match="follow Bridge's Qwen3-VL step") as info:
        _offline_plan(num_moe_experts=4, moe_layer_pattern=(1,) * 4)
    assert info.value.fix == ("model.cuda_graph.language.enabled=false",)


def test_packed_rows_of_varying_width_are_refused_under_sequence_parallelism():
    """A replay pads each rank's slice of the rows at its own end (``packed_misfit``'s ``split``): only a micro-batch
    as wide as its budget replays, so the Qwen3-VL step's varying widths are refused at tp > 1 with sequence
    parallelism, and its fixed width (pp > 1 or ep > 1) plans on its one derived budget; tp > 1 without sequence
    parallelism and offline rows (always seq_length wide) plan as before."""
    from bridge_cudagraph.config import CudaGraphConfig, LanguageGraphConfig
    from bridge_cudagraph.plan.build import build_plan
    from bridge_cudagraph.plan.facts import PackingFacts

    sp = {"tp": 2, "sequence_parallel": True}
    with pytest.raises(
        CudaGraphConfigError, match=r"sequence_parallel=true at tp 2 .* Qwen3-VL step's packed"
    ) as info:
        _packed_plan(facts=sp)
    assert info.value.fix == ("model.sequence_parallel=false",)
    assert _packed_plan(facts={"tp": 2}).language.packed is not None
    facts = _packed_plan(facts={"tp": 2}).facts
    facts = dataclasses.replace(facts, sequence_parallel=True)
    fixed = PackingFacts("qwen3_vl_step", fixed_width=True)
    one = build_plan(facts, CudaGraphConfig(language=LanguageGraphConfig(enabled=True)), world_size=2,
                     micro_batch_size=2, global_batch_size=2, packing=fixed)  # fmt: skip
    assert len(one.language.packed.token_budgets) == 1
    # Bridge's step pads each row to exactly seq_length there (force_to_pad_to_seq_len), not to a multiple of
    # lcm(tp, 16): the one budget is that width, so every micro-batch fills it and replays.
    odd = build_plan(dataclasses.replace(facts, seq_length=1000), CudaGraphConfig(language=LanguageGraphConfig(
                     enabled=True)), world_size=2, micro_batch_size=2, global_batch_size=2, packing=fixed)  # fmt: skip
    assert odd.language.packed.token_budgets == (2000,) and odd.language.packed.max_seqlen == 1000
    with pytest.raises(
        CudaGraphConfigError, match=r"token_budgets=\[1024, 4096\] with model.sequence_parallel"
    ) as info:
        build_plan(facts, CudaGraphConfig(language=LanguageGraphConfig(enabled=True, token_budgets=[1024, 4096])),
                   world_size=2, micro_batch_size=2, global_batch_size=2, packing=fixed)  # fmt: skip
    assert info.value.fix == ("model.cuda_graph.language.token_budgets=null",)
    assert _offline_plan(tp=2, sequence_parallel=True, num_attention_heads=8).language.packed is not None


def _offline_plan(micro_batch_size: int = 1, *, separate_padded: bool = False, **fields):
    """A GPT on GPT SFT offline packing (rows of seq_length, one per micro-batch)."""
    from bridge_cudagraph.config import CudaGraphConfig, LanguageGraphConfig
    from bridge_cudagraph.plan.build import build_plan
    from bridge_cudagraph.plan.facts import ModelFacts, PackingFacts

    language = {k: fields.pop(k) for k in ("token_budgets", "max_sequences") if k in fields}
    shape = dict(num_layers=4, hidden_size=512, num_attention_heads=8, kv_channels=64, seq_length=1024)
    facts = ModelFacts(provider="CudaGraphGPTModelProvider", **{**shape, **fields})
    cfg = CudaGraphConfig(language=LanguageGraphConfig(enabled=True, **language))
    return build_plan(
        facts,
        cfg,
        world_size=facts.tp * facts.cp,
        micro_batch_size=micro_batch_size,
        global_batch_size=micro_batch_size * 4,
        packing=PackingFacts("offline", fixed_width=True, separate_padded=separate_padded),
    )


def test_offline_packed_plan_is_one_budget_of_seq_length_and_refuses_what_it_cannot_replay():
    from bridge_cudagraph.config import CudaGraphConfigError

    packed = _offline_plan().language.packed
    assert packed.offline and packed.token_budgets == (1024,) and packed.budgets_derived
    assert (packed.max_sequences, packed.max_seqlen, packed.separate_padded) == (1024 // 32, 1024, False)
    ((_, inputs),) = packed.static_inputs
    assert [x.name for x in inputs] == ["hidden_states", "rotary_pos_emb", "cu_seqlens"]  # no padded copy
    assert inputs[1].note == "(RoPE, by position in its sequence)"
    padded = _offline_plan(separate_padded=True, max_sequences=8).language.packed
    assert padded.separate_padded and padded.max_sequences == 8
    assert [x.name for x in padded.static_inputs[0][1]][-1] == "cu_seqlens_padded"
    assert _offline_plan(token_budgets=[1024]).language.packed.token_budgets == (1024,)
    with pytest.raises(CudaGraphConfigError, match=r"token_budgets=\[512, 1024\] with offline packing"):
        _offline_plan(token_budgets=[512, 1024])
    with pytest.raises(CudaGraphConfigError, match=r"set train\.micro_batch_size=1"):
        _offline_plan(2)
    with pytest.raises(CudaGraphConfigError, match="GPT step partitions each packed row"):
        _offline_plan(cp=2)
    with pytest.raises(CudaGraphConfigError, match="a multiple of 3"):
        _offline_plan(tp=3, sequence_parallel=True, num_attention_heads=9)


# ------------------------------------------------------------------ defaults from the data path, and their sources
def _vision_plan(images=None, **vision):
    from bridge_cudagraph.plan.facts import ImageFacts

    pixels = None if images is None else ImageFacts(*images)
    return build_plan(
        qwen3_vl_8b(),
        both_on(**vision),
        world_size=8,
        micro_batch_size=2,
        global_batch_size=128,
        images=pixels,
    ).vision


def test_max_patches_per_image_comes_from_the_data_paths_max_pixels():
    """Bridge's Qwen-VL collate passes max_pixels 1003520: 1003520 // 16**2 = 3920 patches, and the plan says so;
    the static cu_seqlens then holds the tail of the largest budget in pieces of 3920 (9 of them for 32768)."""
    vision = _vision_plan((1003520, "passed to the processor by Bridge's collate, qwen2_5_collate_fn"))
    assert vision.max_patches_per_image == 3920
    assert vision.patches_source == (
        "from max_pixels 1003520 // 16**2 = 3920, passed to the processor by Bridge's collate, qwen2_5_collate_fn"
    )
    assert vision.layout.cu_seqlens_length == 1 + 512 + 9 == vision.inputs_at(512)[-1].shape[0]
    from bridge_cudagraph.plan.facts import ImageFacts

    images = ImageFacts(1003520, "the collate")
    text = build_plan(
        qwen3_vl_8b(), both_on(), world_size=8, micro_batch_size=2, global_batch_size=128, images=images
    ).describe()
    lines = text.splitlines()
    i = lines.index("  at most 3920 patches per image (the static attention max_seqlen):")
    assert lines[i + 1] == "    from max_pixels 1003520 // 16**2 = 3920, the collate"
    assert max(map(len, lines)) <= 119


def test_max_patches_per_image_is_at_most_the_largest_budget_and_says_why_where_unknown():
    """A processor that allows more than the largest budget gives the largest budget; no processor, the largest
    budget with the reason; a set value is kept and printed without a source."""
    big = _vision_plan((16777216, "size.longest_edge of P's preprocessor_config.json"))
    assert big.max_patches_per_image == 32768
    assert big.patches_source.startswith("the largest budget, below max_pixels 16777216 // 16**2 = 65536")
    unknown = _vision_plan((None, "the dataset names no processor (dataset.hf_processor_path)"))
    assert unknown.max_patches_per_image == 32768
    assert unknown.patches_source == "the largest budget; the dataset names no processor (dataset.hf_processor_path)"
    assert _vision_plan().patches_source == "the largest budget; no data path was read"
    given = _vision_plan((1003520, "the collate"), max_patches_per_image=2048)
    assert (given.max_patches_per_image, given.patches_source) == (2048, "")


def test_max_patches_per_image_above_the_largest_budget_is_refused():
    with pytest.raises(CudaGraphConfigError) as info:
        _vision_plan(token_budgets=[1024, 4096], max_patches_per_image=5000)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("model.cuda_graph.vision.max_patches_per_image=5000 is above the largest vision budget")
    assert "set it to 4096 or less (or null), or add a budget of at least 5000" in message
    assert _vision_plan(token_budgets=[1024, 4096], max_patches_per_image=4096).max_patches_per_image == 4096


@pytest.mark.parametrize("setting", [{"token_budgets": [1024, 4096]}, {"max_sequences": 4}])
def test_packed_only_language_settings_on_a_padded_run_are_refused(setting):
    """``language.token_budgets`` and ``max_sequences`` do nothing when every micro-batch is padded (one shape):
    refused, not silently ignored; the fix names the packing switch of the model's family."""
    ((name, value),) = setting.items()
    cfg = cuda_graph_config_from_dict({"language": {"enabled": True, **setting}})
    with pytest.raises(CudaGraphConfigError) as info:
        plan(qwen3_vl_8b(), cfg)
    message = str(info.value)
    assert message.startswith(f"model.cuda_graph.language.{name}={value!r} applies to packed micro-batches only")
    assert "pads every micro-batch to model.seq_length 4096" in message
    assert "enable_in_batch_packing=true" in message
    with pytest.raises(CudaGraphConfigError, match=r"enable_offline_packing=true \(GPT SFT\)"):
        plan(qwen3_8b(), cfg)


def test_packed_context_parallel_is_one_check():
    """The refusal build_plan makes, and the one the check before Bridge's finalization calls."""
    from bridge_cudagraph.plan.checks import check_packed_context_parallel
    from bridge_cudagraph.plan.facts import PackingFacts

    check_packed_context_parallel(1, PackingFacts("qwen3_vl_step"))
    with pytest.raises(CudaGraphConfigError, match=r"context_parallel_size=2: .* by index \(2 ranks x 2 chunks"):
        check_packed_context_parallel(2, PackingFacts("qwen3_vl_step"))
    with pytest.raises(CudaGraphConfigError, match="GPT step partitions each packed row"):
        check_packed_context_parallel(4, PackingFacts("offline", fixed_width=True))


def test_derived_values_say_their_source_and_set_ones_do_not():
    """Micro-batches per step, warmups, the switches left null: each default names where it comes from."""
    derived = plan(qwen3_vl_8b(), both_on())
    assert derived.num_microbatches_source == "128 / (2 x dp 4)"
    assert derived.language.warmup_source == derived.vision.warmup_source == "model.cuda_graph_warmup_steps"
    assert derived.switches_defaulted == (
        "cached_walks.optimizer",
        "cached_walks.grad_finalize",
        *(f"forward.{part}" for part in FORWARD_PARTS),
    )
    text = derived.describe()
    assert (
        "  on wherever graphs are (left null): cached_walks.optimizer, cached_walks.grad_finalize, forward.positions"
        in text
    )
    cfg = cuda_graph_config_from_dict(
        {
            "language": {"enabled": True, "warmup_steps": 5},
            "vision": {"enabled": True},
            "num_microbatches": 16,
            "cached_walks": {"optimizer": True, "grad_finalize": False},
            "forward": dict.fromkeys(FORWARD_PARTS, False),
        }
    )
    given = plan(qwen3_vl_8b(), cfg)
    assert given.num_microbatches_source == "" and given.language.warmup_source == ""
    # The vision block sets none: it follows the language warmup, which finalize() copies onto the model.
    assert (given.vision.warmup_steps, given.vision.warmup_source) == (5, "language.warmup_steps")
    assert given.switches_defaulted == ()
    text = given.describe()
    assert "micro-batches per step 16\n" in text and "left null" not in text


def test_a_layer_unit_chosen_for_the_model_says_why():
    moe = dataclasses.replace(qwen3_vl_8b(), num_moe_experts=8, moe_layer_pattern=(1,) * 36)
    cfg = cuda_graph_config_from_dict({"language": {"enabled": True, "modules": ["attn"]}})
    p = plan(moe, cfg)
    assert p.language.graph_unit == "layer"
    assert "  one graph per layer (graph_unit null: each MoE layer's MLP half runs eagerly after its graph)" in (
        p.describe()
    )


def test_counts_of_one_are_singular():
    """ "1 graph", "1 budget", "1 step": a one-layer, one-rank, offline-packed GPT says each in the singular."""
    from bridge_cudagraph.config import LanguageGraphConfig
    from bridge_cudagraph.plan.facts import PackingFacts

    facts = ModelFacts(
        provider="CudaGraphGPTModelProvider",
        num_layers=1,
        hidden_size=64,
        num_attention_heads=4,
        kv_channels=16,
        seq_length=256,
        cuda_graph_warmup_steps=1,
    )
    cfg = CudaGraphConfig(language=LanguageGraphConfig(enabled=True))
    p = build_plan(
        facts,
        cfg,
        world_size=1,
        micro_batch_size=1,
        global_batch_size=1,
        packing=PackingFacts("offline", fixed_width=True),
    )
    lines = p.describe().splitlines()
    assert lines[0] == "capture plan: CudaGraphGPTModelProvider on 1 rank, bf16"
    i = lines.index("language: 1 layer in 1 run x 1 budget each (packed THD) = 1 graph per rank,")
    assert lines[i + 1] == "  whole layers, capture after 1 step (model.cuda_graph_warmup_steps)"
    assert lines[-1].startswith("busiest rank: 1 graph;")
    one = build_plan(qwen3_vl_8b(tp=1), both_on(), world_size=1, micro_batch_size=2, global_batch_size=2).describe()
    assert "vision: 4 graphs x 21 budgets = 84 graphs per rank on rank 0," in one.splitlines()
    assert not any(word in p.describe() for word in (" 1 graphs", " 1 budgets", " 1 steps", " 1 layers", " 1 runs"))


def test_tight_packing_is_derived_on_the_qwen3_vl_rows_at_pp_1_and_off_elsewhere_with_its_reason():
    from bridge_cudagraph.capture.from_plan import packed_helper_arguments
    from bridge_cudagraph.config import CudaGraphConfig, LanguageGraphConfig
    from bridge_cudagraph.plan.build import build_plan
    from bridge_cudagraph.plan.facts import PackingFacts

    on = _packed_plan()
    assert on.language.packed.tight and on.language.packed.tight_source.startswith("on:")
    assert packed_helper_arguments(on)["tight"] is True
    assert "tight packing on:" in on.describe()
    pp = _packed_plan(facts={"pp": 2})
    assert not pp.language.packed.tight and "pipeline or sequence parallelism" in pp.language.packed.tight_source
    assert packed_helper_arguments(pp)["tight"] is False
    facts = on.facts
    cfg = CudaGraphConfig(language=LanguageGraphConfig(enabled=True), forward=ForwardConfig(positions=False))
    no_waits = build_plan(facts, cfg, world_size=1, micro_batch_size=2, global_batch_size=2,
                          packing=PackingFacts("qwen3_vl_step"))  # fmt: skip
    assert not no_waits.language.packed.tight and "forward.positions" in no_waits.language.packed.tight_source
    fixed = build_plan(facts, CudaGraphConfig(language=LanguageGraphConfig(enabled=True)), world_size=1,
                       micro_batch_size=2, global_batch_size=2,
                       packing=PackingFacts("qwen3_vl_step", fixed_width=True))  # fmt: skip
    assert not fixed.language.packed.tight and "seq_length" in fixed.language.packed.tight_source
    assert not _offline_plan().language.packed.tight


def test_tight_packing_is_its_own_setting():
    """``language.tight_packing``: null on where the plan can, ``false`` off with the setting named (the packed
    helper then replays full rows), ``true`` where it cannot work refused with the reason and a fix that validates,
    and ``true`` on padded micro-batches refused as the other packed-only settings are."""
    from bridge_cudagraph.capture.from_plan import packed_helper_arguments

    assert _packed_plan(tight_packing=True).language.packed.tight
    off = _packed_plan(tight_packing=False)
    assert not off.language.packed.tight and off.language.packed.tight_source == "off: language.tight_packing=false"
    assert (
        packed_helper_arguments(off)["tight"] is False
        and "tight packing off: language.tight_packing" in off.describe()
    )
    assert off.forward.positions  # the positions stay: only the packing is off
    with pytest.raises(
        CudaGraphConfigError, match=r"tight_packing=true cannot work here: pipeline or sequence"
    ) as info:
        _packed_plan(tight_packing=True, facts={"pp": 2})
    assert info.value.fix == ("model.cuda_graph.language.tight_packing=null",)
    with pytest.raises(CudaGraphConfigError, match=r"tight_packing=true cannot work here: .*forward\.positions"):
        _packed_plan(tight_packing=True, facts={}, forward_positions=False)
    padded = cuda_graph_config_from_dict({"language": {"enabled": True, "tight_packing": True}})
    with pytest.raises(
        CudaGraphConfigError, match=r"language\.tight_packing=true applies to packed micro-batches only"
    ):
        plan(qwen3_8b(), padded)
    plan(qwen3_8b(), cuda_graph_config_from_dict({"language": {"enabled": True, "tight_packing": False}}))


def test_packed_moe_graphs_count_their_attention_half_in_the_memory_estimate():
    """A packed MoE layer's graph holds its attention only: the plan's pool counts that half (the input norm's and the
    attention's saved tensors and parameters), less than a whole layer's and more than nothing (it was left out while
    the scope was megatron-core's partial one)."""
    from bridge_cudagraph.plan.memory import TrainingFacts, estimate, language_activation_bytes, language_layer_params

    training = TrainingFacts(dp=1)
    moe = estimate(_packed_plan(facts=MOE_FACTS), training)
    dense = estimate(_packed_plan(), training)
    assert 0 < moe.language_graphs < dense.language_graphs
    facts = _packed_plan().facts
    assert 0 < language_activation_bytes(facts, attention_only=True) < language_activation_bytes(facts)
    assert 0 < language_layer_params(facts, attention_only=True) < language_layer_params(facts)
