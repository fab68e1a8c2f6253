"""The static attention under TE's deterministic kernels: ``max_seqlen`` below TE 2.20's unfused threshold (a set one
above it refused with a fix that plans), a derived ladder's cuDNN workspace within the limit, a set ladder's counted,
the workspace in the memory estimate."""

from __future__ import annotations

import pytest

from bridge_cudagraph.config import CudaGraphConfigError, cuda_graph_config_from_dict
from bridge_cudagraph.plan.budgets import PackedLayout
from bridge_cudagraph.plan.build import build_plan
from bridge_cudagraph.plan.determinism import (
    DERIVED_WORKSPACE_LIMIT,
    UNFUSED_FROM,
    cut_derived_ladder,
    deterministic_budgets,
    deterministic_kernels,
    deterministic_max_seqlen,
    dropped_source,
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


def test_the_largest_seqlen_below_the_threshold():
    def segments(seqlen):
        return 4 + -(-8192 // seqlen)

    fused = deterministic_max_seqlen(8192, 16, segments, multiple=4)
    assert fused % 4 == 0 and segments(fused) * 16 * fused**2 < UNFUSED_FROM
    assert segments(fused + 4) * 16 * (fused + 4) ** 2 >= UNFUSED_FROM  # the largest such multiple
    assert deterministic_max_seqlen(64, 16, segments) == 64  # fits as it is
    assert deterministic_max_seqlen(8192, 10**9, segments, multiple=4) == 0  # nothing fits


@pytest.mark.parametrize(
    ("segments", "tokens", "gib"),
    [
        (63, 3200, 32),  # run 114's ours_padded vision capture at the 2B shape (the plan had said 8 GiB)
        (63, 2048, 8),
        (63, 8192, 128),
        (2, 3200, 16),  # fewer than 32 segments count as 32
        (32, 3200, 16),
        (65, 3200, 64),
        (59, 192, 2),  # fewer than 1024 tokens count as 1024
        (2, 512, 1),
        (4, 8192, 64),
    ],
)
def test_the_workspace_is_every_segment_sized_for_every_token(segments, tokens, gib):
    """What cuDNN asked for at these shapes (16 heads; ``results/padded-gradients/run115``): ``2 x heads x
    pow2(segments) x pow2(tokens)**2`` bytes, at least 32 segments and 1024 tokens."""
    assert workspace_bytes(segments, 16, tokens) == gib * 2**30


def test_a_derived_ladder_keeps_the_rungs_whose_workspace_fits():
    """63 static segments x 16 heads: 2048 tokens ask 8 GiB, 2560 round to 4096 and ask 32 GiB."""
    ladder = (256, 512, 1088, 2048, 2560, 3200)
    assert deterministic_budgets(ladder, 16, lambda top: 63, workspace=DERIVED_WORKSPACE_LIMIT) == ladder[:4]
    assert deterministic_budgets(ladder, 16, lambda top: 31, workspace=DERIVED_WORKSPACE_LIMIT) == ladder
    assert deterministic_budgets(ladder, 16, lambda top: 2000, workspace=DERIVED_WORKSPACE_LIMIT) == ()


def test_a_cut_ladder_says_why_at_its_full_top_and_an_uncut_one_says_nothing():
    ladder = (256, 512, 1088, 2048, 2560, 3200)
    assert cut_derived_ladder(ladder, 16, lambda top: 31) == (ladder, "")
    kept, why = cut_derived_ladder(ladder, 16, lambda top: 63)
    assert kept == ladder[:4]
    assert "3200 tokens in 63 static segments x 16 heads asks 32 GiB" in why  # the full top's, not the kept top's
    assert dropped_source(kept, why).startswith("budgets above 2048 dropped for deterministic kernels: under ")
    assert cut_derived_ladder(ladder, 16, lambda top: 2000)[0] == ()


def test_without_deterministic_kernels_the_plan_is_unchanged():
    plan = _plan(False)
    assert plan.vision.max_patches_per_image == 3920 and plan.vision.deterministic_workspace == 0
    assert "deterministic" not in plan.describe()


def test_a_derived_shape_is_lowered_below_the_threshold_and_its_ladder_within_the_workspace_limit():
    """The 8B's derived ladder (16 heads, 512 images) would give TE's unfused attention and ask cuDNN for far more
    than the limit: max_seqlen lowered, the ladder's top rungs dropped, and both said."""
    loose = _plan(False).vision
    assert _segments(loose) * 16 * loose.max_patches_per_image**2 >= UNFUSED_FROM  # the premise
    assert workspace_bytes(_segments(loose), 16, loose.token_budgets[-1]) > DERIVED_WORKSPACE_LIMIT
    plan = _plan(True)
    v = plan.vision
    assert v.max_patches_per_image < 3920 and v.max_patches_per_image % 4 == 0
    assert _segments(v) * 16 * v.max_patches_per_image**2 < UNFUSED_FROM
    assert v.token_budgets == loose.token_budgets[: len(v.token_budgets)]
    assert len(v.token_budgets) < len(loose.token_budgets)
    assert v.deterministic_workspace == workspace_bytes(_segments(v), 16, v.token_budgets[-1])
    assert v.deterministic_workspace <= DERIVED_WORKSPACE_LIMIT
    assert f"lowered from {v.token_budgets[-1]} for deterministic kernels" in v.patches_source
    assert v.budgets_source.startswith(f"budgets above {v.token_budgets[-1]} dropped for deterministic kernels")
    text = plan.describe()
    assert "dropped for deterministic kernels" in text
    assert "deterministic kernels: cuDNN's attention backward workspace about" in text
    assert max(map(len, text.splitlines())) <= 119


#: A set shape below TE's threshold whose workspace is above the derived limit: 2 images + 2 tail pieces x 16 heads x
#: 2048**2 (2**28 elements) at 8192 tokens, 64 GiB of workspace.
SET_BELOW = {"token_budgets": [8192], "max_images_per_microbatch": 2, "max_patches_per_image": 2048}


def test_the_workspace_is_in_the_memory_estimate():
    off, on = _plan(False, **SET_BELOW), _plan(True, **SET_BELOW)
    assert on.vision.deterministic_workspace == workspace_bytes(6, 16, 8192) == 64 * 2**30
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
    assert plan.vision.max_patches_per_image == 2048 and plan.vision.token_budgets == (8192,)
    assert plan.vision.deterministic_workspace > DERIVED_WORKSPACE_LIMIT  # allowed when set, but counted
    derived = _plan(True, **{**SET_BELOW, "token_budgets": None, "max_patches_per_image": None}).vision
    assert derived.token_budgets[-1] < 8192 and derived.deterministic_workspace <= DERIVED_WORKSPACE_LIMIT


def test_a_shape_that_fits_only_below_the_smallest_image_is_refused_with_a_fix_that_plans():
    """With the collate's 784-patch floor and 600 image slots set, TE's fused backend needs max_seqlen below 784
    patches: no image would replay, so the plan refuses instead of lowering, and its fix plans."""
    collate = ImageFacts(max_pixels=1003520, source="Bridge's collate", min_pixels=200704)
    with pytest.raises(CudaGraphConfigError) as refused:
        _plan(True, images=collate, max_images_per_microbatch=600)
    assert "at or above the smallest image (784 patches)" in str(refused.value)
    (fix,) = refused.value.fix
    assert fix == "model.cuda_graph.vision.enabled=false"
    assert not _plan(True, images=collate, enabled=False).vision.enabled


def test_a_ladder_whose_workspace_never_fits_is_refused_with_a_fix_that_plans():
    """1000 image slots ask cuDNN for 32 GiB at even the fewest tokens: no rung fits the limit."""
    with pytest.raises(CudaGraphConfigError) as refused:
        _plan(True, max_images_per_microbatch=1000)
    assert "and no budget fits with 1000 or more images per micro-batch" in str(refused.value)
    (fix,) = refused.value.fix
    assert fix == "model.cuda_graph.vision.enabled=false"


def test_the_8b_photo_ladder_under_deterministic_kernels_keeps_its_image_floor():
    """With the collate's floor the derived image slots shrink with the ladder's top, so more rungs fit."""
    collate = ImageFacts(max_pixels=1003520, source="Bridge's collate", min_pixels=200704)
    v = _plan(True, images=collate).vision
    assert v.token_budgets[-1] >= 784 and v.max_images_per_microbatch == v.token_budgets[-1] // 784
    assert v.deterministic_workspace == workspace_bytes(_segments(v), 16, v.token_budgets[-1])
    assert v.deterministic_workspace <= DERIVED_WORKSPACE_LIMIT


# ------------------------------------------------------------------------------------------ packed language graphs
def _language_plan(deterministic: bool, budgets: list[int] | None = None, **changes):
    """Packed language graphs of Qwen3-VL's 2B language shape (16 heads, sequence 4096, micro-batch 2) on Bridge's
    Qwen3-VL step, with the derived ladder or ``budgets``."""
    import dataclasses

    from bridge_cudagraph.plan.facts import PackingFacts

    shape = {"num_layers": 28, "hidden_size": 2048, "num_attention_heads": 16, **changes}
    facts = dataclasses.replace(qwen3_vl_8b(tp=1), **shape)
    cfg = cuda_graph_config_from_dict({"language": {"enabled": True, "token_budgets": budgets}})
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


def test_a_derived_packed_ladder_keeps_the_rungs_within_the_workspace_limit():
    """8192 tokens ask 64 GiB: the derived ladder keeps its rungs up to 4096 tokens (16 GiB), where the rows keep
    their width (2 rows and one tail piece stay below TE's unfused threshold)."""
    plain, det = _language_plan(False), _language_plan(True)
    packed = det.language.packed
    assert packed.token_budgets == tuple(b for b in plain.language.packed.token_budgets if b <= 4096)
    assert packed.max_seqlen == packed.row_width == 4096 and packed.max_seqlen_source == ""
    assert _static_elements(packed) < UNFUSED_FROM
    segments = packed.layout.cu_seqlens_length - 1
    assert packed.deterministic_workspace == workspace_bytes(segments, 16, 4096) == DERIVED_WORKSPACE_LIMIT
    text = det.describe()
    assert f"budgets above {packed.token_budgets[-1]} dropped for deterministic kernels" in text
    assert "asks 64 GiB of workspace" in text and "a larger micro-batch runs eagerly" in text
    assert "deterministic kernels: cuDNN's attention backward workspace" in text
    # The workspace is in the language pool's estimate (against the same rungs without deterministic kernels).
    same = _language_plan(False, budgets=list(packed.token_budgets))
    assert det.memory.language_graphs - same.memory.language_graphs == packed.deterministic_workspace


def test_a_set_packed_ladder_lowers_max_seqlen_below_the_unfused_threshold_and_counts_its_workspace():
    det = _language_plan(True, budgets=[8192])
    packed = det.language.packed
    assert packed.token_budgets == (8192,) and packed.budgets_source == ""
    assert packed.row_width == 4096 and packed.max_seqlen < 4096 and packed.max_seqlen % 16 == 0
    assert _static_elements(packed) < UNFUSED_FROM
    # The largest such width: one rounding step more crosses the threshold.
    wider = PackedLayout(packed.token_budgets, max_sequences=packed.max_sequences, max_seqlen=packed.max_seqlen + 16)
    assert (wider.cu_seqlens_length - 1) * 16 * (packed.max_seqlen + 16) ** 2 >= UNFUSED_FROM
    assert packed.deterministic_workspace == 64 * 2**30  # counted, not limited: the block set the ladder
    text = det.describe()
    assert "lowered from 4096 for deterministic kernels" in text and "a longer row runs eagerly" in text


def test_a_small_packed_shape_keeps_its_width_under_deterministic_kernels():
    packed = _language_plan(True, seq_length=256, num_attention_heads=4).language.packed
    assert packed.max_seqlen == packed.row_width == 256 and packed.max_seqlen_source == ""
    assert 0 < packed.deterministic_workspace <= DERIVED_WORKSPACE_LIMIT
