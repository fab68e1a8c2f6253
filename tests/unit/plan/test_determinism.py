"""The static vision attention under TE's deterministic kernels: below TE 2.20's unfused threshold, a derived shape's
cuDNN workspace within the limit, a set one refused with a fix that plans, the workspace in the memory estimate."""

from __future__ import annotations

import pytest

from bridge_cudagraph.config import CudaGraphConfigError, cuda_graph_config_from_dict
from bridge_cudagraph.plan.budgets import PackedLayout
from bridge_cudagraph.plan.build import build_plan
from bridge_cudagraph.plan.determinism import (
    DERIVED_WORKSPACE_LIMIT,
    UNFUSED_FROM,
    deterministic_kernels,
    deterministic_max_seqlen,
    workspace_bytes,
)
from bridge_cudagraph.plan.facts import ImageFacts
from bridge_cudagraph.plan.memory import TrainingFacts
from tests.unit.plan.test_build import qwen3_vl_8b

pytestmark = pytest.mark.fast

#: The photo data path's cap (Bridge's qwen2_5_collate_fn): 3920 patches of 16 x 16 per image.
PHOTOS = ImageFacts(max_pixels=1003520, source="the photo collate")


def _plan(deterministic: bool, images: ImageFacts | None = PHOTOS, **vision):
    cfg = cuda_graph_config_from_dict({"vision": {"enabled": True, **vision}})
    return build_plan(
        qwen3_vl_8b(tp=1),
        cfg,
        world_size=1,
        micro_batch_size=2,
        global_batch_size=2,
        images=images,
        training=TrainingFacts(),
        deterministic=deterministic,
    )


def _segments(vision) -> int:
    return vision.layout.cu_seqlens_length - 1


@pytest.mark.parametrize(("value", "expected"), [("0", True), (" 0 ", True), ("1", False), (None, False)])
def test_the_switch_is_tes_variable(value, expected):
    environ = {} if value is None else {"NVTE_ALLOW_NONDETERMINISTIC_ALGO": value}
    assert deterministic_kernels(environ) is expected


def test_the_largest_seqlen_below_the_threshold_and_the_workspace():
    def segments(seqlen):
        return 4 + -(-8192 // seqlen)

    fused = deterministic_max_seqlen(8192, 16, segments, multiple=4)
    assert fused % 4 == 0 and segments(fused) * 16 * fused**2 < UNFUSED_FROM
    assert segments(fused + 4) * 16 * (fused + 4) ** 2 >= UNFUSED_FROM  # the largest such multiple
    small = deterministic_max_seqlen(8192, 16, segments, multiple=4, workspace=2**30)
    assert small < fused and workspace_bytes(segments(small), 16, small) <= 2**30
    assert deterministic_max_seqlen(64, 16, segments) == 64  # fits as it is
    assert deterministic_max_seqlen(8192, 10**9, segments, multiple=4) == 0  # nothing fits


def test_the_workspace_rounds_segments_and_length_up_to_powers_of_two():
    """cuDNN's own ask on the 2B vision shape: 59 static segments x 16 heads at max_seqlen 376 asked for exactly
    32 GiB, ``128 x 64 x 16 x 512**2`` (the unrounded product is 15.9 GiB)."""
    assert workspace_bytes(59, 16, 376) == 32 * 2**30
    assert workspace_bytes(33, 16, 257) == workspace_bytes(64, 16, 512)
    assert workspace_bytes(2, 16, 512) == 128 * 2 * 16 * 512**2  # TE's note: powers of two as they are
    assert workspace_bytes(2, 16, 256) == workspace_bytes(1, 1, 1) == 2**30  # never less than 1 GiB


def test_a_lowered_length_keeps_the_rounded_workspace_within_the_limit():
    """59 segments x 16 heads within 16 GiB: 376 rounds to 512 (32 GiB), so the largest length is 256."""
    fits = deterministic_max_seqlen(3200, 16, lambda seqlen: 59, multiple=4, workspace=DERIVED_WORKSPACE_LIMIT)
    assert fits == 256 and workspace_bytes(59, 16, fits) <= DERIVED_WORKSPACE_LIMIT
    assert workspace_bytes(59, 16, fits + 4) > DERIVED_WORKSPACE_LIMIT


def test_without_deterministic_kernels_the_plan_is_unchanged():
    plan = _plan(False)
    assert plan.vision.max_patches_per_image == 3920 and plan.vision.deterministic_workspace == 0
    assert "deterministic" not in plan.describe()


def test_a_derived_shape_is_lowered_below_the_threshold_and_the_workspace_limit():
    """The 8B's derived ladder (16 heads, 512 images) would give TE's unfused attention: lowered, and said."""
    loose = _plan(False).vision
    assert _segments(loose) * 16 * loose.max_patches_per_image**2 >= UNFUSED_FROM  # the premise
    plan = _plan(True)
    v = plan.vision
    assert v.max_patches_per_image < 3920 and v.max_patches_per_image % 4 == 0
    assert _segments(v) * 16 * v.max_patches_per_image**2 < UNFUSED_FROM
    assert v.deterministic_workspace == workspace_bytes(_segments(v), 16, v.max_patches_per_image)
    assert v.deterministic_workspace <= DERIVED_WORKSPACE_LIMIT
    assert "lowered from 3920 for deterministic kernels" in v.patches_source
    text = plan.describe()
    assert "deterministic kernels: cuDNN's attention backward workspace about" in text
    assert max(map(len, text.splitlines())) <= 119


#: A shape below TE's threshold whose workspace is above the derived limit: 2 images + 2 tail pieces x 16 heads x
#: 2048**2 (2**28 elements, 32 GiB of workspace).
SET_BELOW = {"token_budgets": [4096], "max_images_per_microbatch": 2, "max_patches_per_image": 2048}


def test_the_workspace_is_in_the_memory_estimate():
    off, on = _plan(False, **SET_BELOW), _plan(True, **SET_BELOW)
    assert on.vision.deterministic_workspace == workspace_bytes(4, 16, 2048)
    assert on.memory.vision_graphs - off.memory.vision_graphs == on.vision.deterministic_workspace


def test_a_set_shape_above_the_threshold_is_refused_with_a_fix_that_plans():
    with pytest.raises(CudaGraphConfigError) as refused:
        _plan(True, max_patches_per_image=8192, max_images_per_microbatch=64)
    error = refused.value
    assert "unfused attention" in str(error) and error.fix
    setting, value = error.fix[0].split("=")
    assert setting == "model.cuda_graph.vision.max_patches_per_image"
    plan = _plan(True, max_patches_per_image=int(value), max_images_per_microbatch=64)
    segments = PackedLayout(plan.vision.token_budgets, max_sequences=64, max_seqlen=int(value)).cu_seqlens_length - 1
    assert segments * 16 * int(value) ** 2 < UNFUSED_FROM


def test_a_set_shape_below_the_threshold_keeps_its_value_and_counts_its_workspace():
    plan = _plan(True, **SET_BELOW)
    assert plan.vision.max_patches_per_image == 2048
    assert plan.vision.deterministic_workspace > DERIVED_WORKSPACE_LIMIT  # allowed when set, but counted
    derived = _plan(True, **{**SET_BELOW, "max_patches_per_image": None}).vision
    assert derived.max_patches_per_image < 2048 and derived.deterministic_workspace <= DERIVED_WORKSPACE_LIMIT


def test_a_shape_that_fits_only_below_the_smallest_image_is_refused_with_a_fix_that_plans():
    """With the collate's 784-patch floor, the 8B's 41 image slots and 32768-patch budgets keep TE's fused backend
    within the workspace limit only below 784 patches per image: no image would replay, so the plan refuses instead of
    lowering, and its fix plans."""
    collate = ImageFacts(max_pixels=1003520, source="Bridge's collate", min_pixels=200704)
    with pytest.raises(CudaGraphConfigError) as refused:
        _plan(True, images=collate)
    assert "at or above the smallest image (784 patches)" in str(refused.value)
    (fix,) = refused.value.fix
    assert fix == "model.cuda_graph.vision.enabled=false"
    assert not _plan(True, images=collate, enabled=False).vision.enabled


# ------------------------------------------------------------------------------------------ packed language graphs
def _language_plan(deterministic: bool, **changes):
    """Packed language graphs of Qwen3-VL's 2B language shape (16 heads, sequence 4096, micro-batch 2) on Bridge's
    Qwen3-VL step."""
    import dataclasses

    from bridge_cudagraph.plan.facts import PackingFacts

    shape = {"num_layers": 28, "hidden_size": 2048, "num_attention_heads": 16, **changes}
    facts = dataclasses.replace(qwen3_vl_8b(tp=1), **shape)
    cfg = cuda_graph_config_from_dict({"language": {"enabled": True}})
    return build_plan(
        facts,
        cfg,
        world_size=1,
        micro_batch_size=2,
        global_batch_size=2,
        packing=PackingFacts("qwen3_vl_step"),
        training=TrainingFacts(),
        deterministic=deterministic,
    )


def _static_elements(packed, heads: int = 16) -> int:
    return (packed.layout.cu_seqlens_length - 1) * heads * packed.max_seqlen**2


def test_packed_language_rows_keep_their_width_without_deterministic_kernels():
    packed = _language_plan(False).language.packed
    assert packed.max_seqlen == packed.row_width == 4096
    assert packed.max_seqlen_source == "" and packed.deterministic_workspace == 0
    # The shape the deterministic plan must avoid: at the top budget TE would drop to unfused attention.
    assert _static_elements(packed) >= UNFUSED_FROM


def test_packed_language_max_seqlen_is_lowered_below_the_unfused_threshold_and_the_workspace_limit():
    plain, det = _language_plan(False), _language_plan(True)
    packed = det.language.packed
    assert packed.row_width == 4096 and packed.max_seqlen < 4096 and packed.max_seqlen % 16 == 0
    assert _static_elements(packed) < UNFUSED_FROM
    segments = packed.layout.cu_seqlens_length - 1
    assert packed.deterministic_workspace == workspace_bytes(segments, 16, packed.max_seqlen)
    assert packed.deterministic_workspace <= DERIVED_WORKSPACE_LIMIT
    # The largest such width: one rounding step more crosses the threshold or the limit.
    wider = PackedLayout(packed.token_budgets, max_sequences=packed.max_sequences, max_seqlen=packed.max_seqlen + 16)
    assert workspace_bytes(wider.cu_seqlens_length - 1, 16, packed.max_seqlen + 16) > DERIVED_WORKSPACE_LIMIT
    # The budgets stay those of the rows; the static cu_seqlens grows by the tail's extra pieces.
    assert packed.token_budgets == plain.language.packed.token_budgets
    assert packed.layout.cu_seqlens_length > plain.language.packed.layout.cu_seqlens_length
    text = det.describe()
    assert "lowered from 4096 for deterministic kernels" in text and "a longer row runs eagerly" in text
    assert "deterministic kernels: cuDNN's attention backward workspace" in text
    # The workspace is in the language pool's estimate.
    assert det.memory.language_graphs - plain.memory.language_graphs == packed.deterministic_workspace


def test_a_small_packed_shape_keeps_its_width_under_deterministic_kernels():
    packed = _language_plan(True, seq_length=256, num_attention_heads=4).language.packed
    assert packed.max_seqlen == packed.row_width == 256 and packed.max_seqlen_source == ""
    assert 0 < packed.deterministic_workspace <= DERIVED_WORKSPACE_LIMIT
