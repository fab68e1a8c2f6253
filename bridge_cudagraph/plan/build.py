"""Deciding the plan: :func:`build_plan` turns :class:`~bridge_cudagraph.plan.facts.ModelFacts` and the
``model.cuda_graph`` block into a :class:`~bridge_cudagraph.plan.capture_plan.CapturePlan`, or refuses with an error
that names the setting, shows the arithmetic and says what to change, instead of a shape error at step N.  Derived
budgets come from :mod:`bridge_cudagraph.plan.budgets`, the functions the capture itself uses, so the plan and the
capture cannot disagree. The one entry point from a Bridge config is
:func:`bridge_cudagraph.plan.from_config.plan_config`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

from bridge_cudagraph.config import CACHED_WALKS, FORWARD_PARTS, CudaGraphConfig, CudaGraphConfigError
from bridge_cudagraph.parallel.layout import (
    ParallelLayout,
    ResolvedLayout,
    Submodule,
    VisionLayout,
    resolve_submodules,
)
from bridge_cudagraph.plan.budgets import (
    MIN_IMAGE_MERGED_TOKENS,
    PackedLayout,
    derive_language_budgets,
    derive_max_segments,
    derive_token_budgets,
    in_flight_microbatches,
    language_segments,
    layer_segments,
    max_patches_per_microbatch,
)
from bridge_cudagraph.plan.capture_plan import (
    CachedWalksPlan,
    CapturePlan,
    ForwardPlan,
    LanguagePlan,
    PackedLanguagePlan,
    PaddedLanguagePlan,
    StaticInput,
    VisionPlan,
)
from bridge_cudagraph.plan.checks import (
    check_model,
    check_packed_language,
    check_padded,
    check_sequence_split,
    language_modules,
)
from bridge_cudagraph.plan.determinism import (
    cut_derived_ladder,
    deterministic_kernels,
    deterministic_max_seqlen,
    dropped_source,
    why_lowered,
    workspace_bytes,
)
from bridge_cudagraph.plan.facts import ImageFacts, ModelFacts, PackingFacts, VisionFacts
from bridge_cudagraph.plan.memory import TrainingFacts, estimate
from bridge_cudagraph.plan.sizes import check_positive as _check_positive

#: Why ``language.modules: null`` on an MoE model is the attention alone, for the plan's text.
MOE_SCOPE_SOURCE = "null on MoE layers"


# ------------------------------------------------------------------------------------------ derivation
def _stage_layers(facts: ModelFacts, where: str) -> list[list[int]]:
    """Global decoder-layer indices each pipeline stage builds, as Megatron-Core's ``get_num_layers_to_build``
    and its layer offsets split them."""
    pp, n = facts.pp, facts.num_layers
    if facts.has_pipeline_layout:
        raise CudaGraphConfigError(
            f"{where}.enabled=true with model.pipeline_model_parallel_layout set: the plan cannot place a custom "
            "layout yet; use num_layers_in_first/last_pipeline_stage instead or set the layout to null",
            fix=("model.pipeline_model_parallel_layout=null",),
        )
    first, last = facts.num_layers_in_first_pipeline_stage, facts.num_layers_in_last_pipeline_stage
    if pp == 1:
        return [list(range(n))]
    if first is not None or last is not None:
        rest, stages_left = n - (first or 0) - (last or 0), pp - (first is not None) - (last is not None)
        if stages_left and rest % stages_left:
            raise CudaGraphConfigError(
                f"model.num_layers {n} minus the uneven first/last stages leaves {rest} layers for {stages_left} "
                f"middle stages ({rest} % {stages_left} = {rest % stages_left}); change the uneven split"
            )
        counts = [rest // stages_left if stages_left else 0] * pp
        if first is not None:
            counts[0] = first
        if last is not None:
            counts[-1] = last
    else:
        extra = int(facts.account_for_embedding_in_pipeline_split) + int(facts.account_for_loss_in_pipeline_split)
        if (n + extra) % pp:
            raise CudaGraphConfigError(
                f"model.num_layers {n}"
                + (f" + {extra} (embedding/loss counted as layers)" if extra else "")
                + f" is not divisible by model.pipeline_model_parallel_size {pp} "
                f"({n + extra} % {pp} = {(n + extra) % pp}); Megatron needs an even split or an uneven "
                "first/last stage"
            )
        counts = [(n + extra) // pp] * pp
        counts[0] -= int(facts.account_for_embedding_in_pipeline_split)
        counts[-1] -= int(facts.account_for_loss_in_pipeline_split)
    # No virtual pipeline here: check_language_ladder refused it before.
    offsets = [sum(counts[:s]) for s in range(pp)]
    return [list(range(offsets[s], offsets[s] + counts[s])) for s in range(pp)]


def _padded_static_inputs(facts: ModelFacts, mbs: int) -> tuple[StaticInput, ...]:
    """The inputs every layer graph of a padded micro-batch reads: the hidden states and the rotary table (with
    Qwen3-VL's mRoPE table, whose values depend on the batch); no attention mask, since the layers are causal and TE
    reads a mask only for padding or arbitrary mask types."""
    s, cp, tp = facts.seq_length, facts.cp, facts.sequence_split
    if tp > 1:
        rows, label = s // cp // tp, "S/cp/tp"
    else:
        rows, label = s // cp, "S/cp"
    inputs = [StaticInput("hidden_states", (rows, mbs, facts.hidden_size), facts.dtype, (label, "mbs", "H"))]
    if facts.position_embedding_type == "mrope":
        # Qwen3VLMultimodalRotaryEmbedding: (S, b, 1, 2 * dim/2) in fp32, sliced along cp (rope.py).
        inputs.append(
            StaticInput(
                "rotary_pos_emb", (s // cp, mbs, 1, facts.rotary_dim), "fp32", ("S/cp", "mbs", "", ""), "(mRoPE)"
            )
        )
    elif facts.position_embedding_type == "rope":
        # RotaryEmbedding(seq): (S, 1, 1, dim) in fp32, the same for every sample; sliced along cp.
        inputs.append(StaticInput("rotary_pos_emb", (s // cp, 1, 1, facts.rotary_dim), "fp32", ("S/cp", "", "", "")))
    return tuple(inputs)


def _vision_static_inputs(vision: VisionFacts, budget: int, cu_length: int, dtype: str) -> tuple[StaticInput, ...]:
    # Qwen3VLVisionModel: hidden_states[:, None] is (B, 1, Hv); the 2-D rotary table is
    # Qwen3VLVisionRotaryEmbedding(head_dim // 2) looked up for (row, col), flattened to head_dim // 2 and
    # repeated twice: (B, 1, 1, Hv / heads) fp32 (vision_model.py, rot_pos_emb and forward).
    return (
        StaticInput("hidden_states", (budget, 1, vision.hidden_size), dtype),
        StaticInput("rotary_pos_emb", (budget, 1, 1, vision.head_dim), "fp32"),
        # The leading 0, one boundary per image frame, the padding's (PackedLayout.cu_seqlens_length).
        StaticInput("cu_seqlens", (cu_length,), "int32"),
    )


def _warmups(cfg: CudaGraphConfig, facts: ModelFacts) -> tuple[tuple[int, str], tuple[int, str]]:
    """Eager steps before each submodule's capture, ``(language, vision)``, each with the setting it comes from
    (empty: the submodule's own ``warmup_steps``): its own ``warmup_steps``, else the model's
    ``cuda_graph_warmup_steps``. The provider's ``finalize()`` copies a set language warmup onto the model
    (Megatron-Core reads it there), so a vision block without one follows the language graphs; resolving that here
    makes the plan the same before and after ``finalize()``."""
    model, source = facts.cuda_graph_warmup_steps, "model.cuda_graph_warmup_steps"
    language = cfg.language.warmup_steps
    if cfg.language.enabled and language is not None:
        model, source = language, "language.warmup_steps"
    vision = cfg.vision.warmup_steps
    return (
        (model, source) if language is None else (language, ""),
        (model, source) if vision is None else (vision, ""),
    )


def _derive_num_microbatches(
    cfg: CudaGraphConfig, *, mbs: int, gbs: int | None, dp: int, needed_by: str | None
) -> int | None:
    """Micro-batches per step: the one derivation (global batch / (micro batch x language dp)); an explicit
    ``num_microbatches`` must agree with it. ``needed_by`` names the setting that needs the count (None: none)."""
    per_step = mbs * dp
    derived = gbs // per_step if gbs is not None and gbs % per_step == 0 else None
    if cfg.num_microbatches is not None:
        if derived is not None and derived != cfg.num_microbatches:
            raise CudaGraphConfigError(
                f"model.cuda_graph.num_microbatches={cfg.num_microbatches} but train.global_batch_size {gbs} / "
                f"(micro batch {mbs} x dp {dp}) = {derived}; set it to {derived} or to null to derive it",
                fix=(f"model.cuda_graph.num_microbatches={derived}",),
            )
        return cfg.num_microbatches
    if derived is None and needed_by is not None:
        if gbs is None:
            raise CudaGraphConfigError(
                f"{needed_by} needs the number of micro-batches per step, but "
                "train.global_batch_size is unset; set it or model.cuda_graph.num_microbatches"
            )
        raise CudaGraphConfigError(
            f"{needed_by} cannot derive the micro-batches per step: "
            f"train.global_batch_size {gbs} is not divisible by micro batch {mbs} x dp {dp} = {per_step} "
            f"({gbs} % {per_step} = {gbs % per_step}); use a multiple of {per_step} (e.g. "
            f"{per_step * max(1, math.ceil(gbs / per_step))}) or change the world size",
            fix=(f"train.global_batch_size={per_step * max(1, math.ceil(gbs / per_step))}",),
        )
    return derived


def deepstack_merges(facts: ModelFacts) -> int:
    """Layers of the language model's first stage after which Qwen3-VL's decoder adds a deepstack feature: one per
    deepstack layer of the encoder (Bridge 0.6.2 ``Qwen3VLTransformerBlock.forward``, ``l_no in
    range(len(deepstack_visual_embeds))``); 0 for a text-only model."""
    return len(facts.vision.deepstack_visual_indexes) if facts.vision is not None else 0


def _language_unit(cfg: CudaGraphConfig, facts: ModelFacts) -> tuple[str, str]:
    """``model.cuda_graph.language.graph_unit`` resolved: ``run`` (runs of layers) where the decoder's loop does
    nothing of its own between whole dense layers, else ``layer``, with the reason a null one is ``layer`` (empty
    otherwise); an explicit ``run`` where it cannot work is refused with the reason and the fix."""
    where = "model.cuda_graph.language.graph_unit"
    asked = cfg.language.graph_unit
    if asked == "layer":
        return "layer", ""
    if not facts.num_moe_experts:
        return "run", ""
    reason = f"{facts.provider} has MoE layers (runs of MoE layers are not verified yet)"
    if asked == "run":
        raise CudaGraphConfigError(
            f"{where}='run' cannot capture runs of layers here: {reason}; set it to 'layer' (or null)",
            fix=("model.cuda_graph.language.graph_unit=layer",),
        )
    return "layer", reason


def _plan_vision(
    cfg: CudaGraphConfig,
    facts: ModelFacts,
    v: VisionFacts,
    *,
    mbs: int,
    num_mb: int | None,
    warmup: tuple[int, str],
    pixels: ImageFacts | None,
    deterministic: bool = False,
) -> VisionPlan:
    max_patches = max_patches_per_microbatch(facts.seq_length, mbs, v.spatial_merge_size)
    modules = tuple(cfg.vision.modules) if cfg.vision.modules is not None else None
    if not cfg.vision.enabled:
        return VisionPlan(
            enabled=False,
            depth=v.depth,
            modules=modules,
            token_budgets=(),
            budgets_derived=False,
            max_patches_per_microbatch=max_patches,
            max_images_per_microbatch=0,
            images_derived=False,
            static_inputs=(),
            copies=1,
            graphs=0,
            warmup_steps=warmup[0],
            warmup_source=warmup[1],
        )
    if cfg.vision.token_budgets is None:
        budgets = derive_token_budgets(facts.seq_length, mbs, v.spatial_merge_size)
        derived = True
    else:
        budgets = list(cfg.vision.token_budgets)  # checked by check_model
        derived = False
    smallest = pixels.smallest_patches(v.patch_size) if pixels is not None else 0
    images, images_derived, images_source = _vision_images(cfg, v, budgets, pixels, smallest)
    longest, patches_source = _max_patches_per_image(cfg, v, budgets, pixels)
    workspace, budgets_source = 0, ""
    if deterministic:
        longest, patches_source = _deterministic_patches(cfg, v, budgets, images, longest, patches_source, smallest)
        if derived:
            budgets, budgets_source = _deterministic_vision_budgets(
                cfg, v, budgets, lambda top: _vision_images(cfg, v, [top], pixels, smallest)[0], longest, smallest
            )
            images, images_derived, images_source = _vision_images(cfg, v, budgets, pixels, smallest)
            # Fewer image slots and tail pieces at the kept top: max_seqlen again, from the value before lowering.
            longest, patches_source = _max_patches_per_image(cfg, v, budgets, pixels, clamp=True)
            longest, patches_source = _deterministic_patches(
                cfg, v, budgets, images, longest, patches_source, smallest
            )
        heads = v.num_heads // cfg.vision.tensor_parallel_size
        workspace = workspace_bytes(_vision_segments(budgets, images, longest), heads, budgets[-1])
    cu_length = PackedLayout(tuple(budgets), max_sequences=images, max_seqlen=longest).cu_seqlens_length
    inputs = tuple((b, _vision_static_inputs(v, b, cu_length, facts.dtype)) for b in budgets)
    # Without a pipeline one copy, whatever the count; with one, build_plan has required the count.
    if facts.pp == 1:
        copies = 1
    else:
        assert num_mb is not None  # build_plan has required the count (above)
        copies = in_flight_microbatches(facts.pp, num_mb)
    unit = cfg.vision.graph_unit or "run"
    segments = layer_segments(v.depth, v.deepstack_visual_indexes, unit)
    return VisionPlan(
        enabled=True,
        depth=v.depth,
        modules=modules,
        token_budgets=tuple(budgets),
        budgets_derived=derived,
        max_patches_per_microbatch=max_patches,
        max_images_per_microbatch=images,
        images_derived=images_derived,
        images_source=images_source,
        static_inputs=inputs,
        copies=copies,
        graphs=len(segments) * len(budgets) * copies,
        warmup_steps=warmup[0],
        max_patches_per_image=longest,
        graph_unit=unit,
        segments=segments,
        patches_source=patches_source,
        warmup_source=warmup[1],
        deterministic_workspace=workspace,
        budgets_source=budgets_source,
    )


def _max_patches_per_image(
    cfg: CudaGraphConfig, v: VisionFacts, budgets: list[int], images: ImageFacts | None, *, clamp: bool = False
) -> tuple[int, str]:
    """``vision.max_patches_per_image`` resolved, with where a derived one comes from (empty when set): what the data
    path's ``max_pixels`` allows one image (``max_pixels // patch_size**2``), at most the largest budget; else the
    largest budget. A set value above the largest budget is refused (such an image runs eagerly anyway), unless
    ``clamp``: the ladder lost its top rungs to deterministic kernels, and the value is held to the top kept."""
    top = budgets[-1]
    given = cfg.vision.max_patches_per_image
    if given is not None:
        if given > top and clamp:
            return top, f"the top budget kept for deterministic kernels, below the block's {given}"
        if given > top:
            raise CudaGraphConfigError(
                f"model.cuda_graph.vision.max_patches_per_image={given} is above the largest vision budget {top} "
                "(model.cuda_graph.vision.token_budgets): an image that large runs eagerly whatever it says; set it "
                f"to {top} or less (or null), or add a budget of at least {given}",
                fix=("model.cuda_graph.vision.max_patches_per_image=null",),
            )
        return given, ""
    if images is None or images.max_pixels is None:
        return top, "the largest budget; " + (images.source if images is not None else "no data path was read")
    cap = images.max_pixels // v.patch_size**2
    derived = f"max_pixels {images.max_pixels} // {v.patch_size}**2 = {cap}, {images.source}"
    if cap >= top:
        return top, f"the largest budget, below {derived}"
    return cap, f"from {derived}"


def _vision_images(
    cfg: CudaGraphConfig, v: VisionFacts, budgets: list[int], pixels: ImageFacts | None, smallest: int
) -> tuple[int, bool, str]:
    """``vision.max_images_per_microbatch`` resolved: ``(images, derived, source)``, the source empty where given or
    derived from images of 4x4 merged tokens (the data path names no floor)."""
    if cfg.vision.max_images_per_microbatch is not None:
        return cfg.vision.max_images_per_microbatch, False, ""
    images = derive_max_segments(budgets, v.spatial_merge_size, smallest or None)
    if smallest <= v.merge_unit * MIN_IMAGE_MERGED_TOKENS:
        return images, True, ""
    assert pixels is not None  # smallest is 0 without it
    source = (
        f"{budgets[-1]} // {smallest} (images of >= {smallest} patches: min_pixels {pixels.min_pixels} // "
        f"{v.patch_size}**2, {pixels.source})"
    )
    return images, True, source


def _vision_segments(budgets: Sequence[int], images: int, max_seqlen: int) -> int:
    """The static vision attention's segment count: every image slot and the top budget's tail pieces."""
    return PackedLayout(tuple(budgets), max_sequences=images, max_seqlen=max_seqlen).cu_seqlens_length - 1


def _deterministic_patches(
    cfg: CudaGraphConfig,
    v: VisionFacts,
    budgets: list[int],
    images: int,
    longest: int,
    source: str,
    smallest_image: int = 0,
) -> tuple[int, str]:
    """``vision.max_patches_per_image`` under TE's deterministic kernels (:mod:`bridge_cudagraph.plan.determinism`),
    with where it comes from: a derived one lowered below TE's unfused threshold (a larger image runs eagerly,
    counted); a set one above it, or a shape where nothing fits, or where what fits is below the data path's smallest
    image (``smallest_image`` patches: no image would replay), refused with the fix."""
    where = "model.cuda_graph.vision"
    heads = v.num_heads // cfg.vision.tensor_parallel_size

    def segments_at(seqlen: int) -> int:
        return _vision_segments(budgets, images, seqlen)

    fits = deterministic_max_seqlen(longest, heads, segments_at, multiple=v.spatial_merge_size**2)
    if fits == longest:
        return longest, source
    why = why_lowered(segments_at(longest), heads, longest)
    if fits < max(smallest_image, 1):
        floor = f" at or above the smallest image ({smallest_image} patches)" if smallest_image else ""
        raise CudaGraphConfigError(
            f"{where}: {why}, and no max_patches_per_image{floor} avoids it with {images} images per micro-batch "
            f"and budgets up to {budgets[-1]} patches; set {where}.max_images_per_microbatch or the top of "
            f"{where}.token_budgets lower, or {where}.enabled=false for deterministic runs",
            fix=(f"{where}.enabled=false",),
        )
    if not source:  # the block set it
        raise CudaGraphConfigError(
            f"{where}.max_patches_per_image={longest}: {why}; set it to {fits} or less (or null: the plan lowers it)",
            fix=(f"{where}.max_patches_per_image={fits}",),
        )
    return fits, f"{source}; lowered from {longest} for deterministic kernels: {why}; a larger image runs eagerly"


def _deterministic_vision_budgets(
    cfg: CudaGraphConfig,
    v: VisionFacts,
    budgets: list[int],
    images_at: Callable[[int], int],
    max_seqlen: int,
    smallest_image: int,
) -> tuple[list[int], str]:
    """A derived vision ladder under TE's deterministic kernels: its rungs up to the largest whose cuDNN workspace
    is within the derived limit (:func:`~bridge_cudagraph.plan.determinism.cut_derived_ladder`; a larger micro-batch
    runs eagerly, counted), with why (empty where none is dropped), the image slots at each top ``images_at(top)``;
    refused, with the fix, where not even a rung that holds the data path's smallest image fits."""
    where = "model.cuda_graph.vision"
    heads = v.num_heads // cfg.vision.tensor_parallel_size

    def segments_at(top: int) -> int:
        return _vision_segments([top], images_at(top), min(max_seqlen, top))

    kept, why = cut_derived_ladder(budgets, heads, segments_at)
    if not why:
        return budgets, ""
    if not kept or kept[-1] < max(smallest_image, 1):
        floor = f" holding the smallest image ({smallest_image} patches)" if smallest_image else ""
        raise CudaGraphConfigError(
            f"{where}: {why}, and no budget{floor} fits with {images_at(budgets[0])} or more images per "
            f"micro-batch; set {where}.max_images_per_microbatch lower, or {where}.enabled=false for "
            "deterministic runs",
            fix=(f"{where}.enabled=false",),
        )
    return list(kept), dropped_source(kept, why)


def offline_max_sequences(seq_length: int) -> int:
    """The sequences an offline-packed row may hold and replay, when ``max_sequences`` is not given: one per 32
    tokens. Bridge's packer knows the real count only after packing (``max_samples_per_bin``); a larger static
    ``cu_seqlens`` costs zero-length segments only, and a row with more runs eagerly (counted, logged once)."""
    return max(2, seq_length // 32)


def _packed_widths(facts: ModelFacts, packing: PackingFacts, mbs: int) -> tuple[int, int, int]:
    """``(max_seqlen, max_tokens, multiple)`` of a packed micro-batch: the longest sequence, the widest packed
    micro-batch and the step between packed widths, as the data path pads them."""
    if packing.mode == "offline":  # packed to seq_length before training (check_offline_packing): one width
        return facts.seq_length, facts.seq_length, facts.seq_length
    if packing.fixed_width:  # the Qwen3-VL step pads every row to exactly seq_length (pp > 1 or ep > 1)
        return facts.seq_length, mbs * facts.seq_length, mbs * facts.seq_length
    # Bridge's qwen3_vl_step (_pad_and_pack_qwen3_vl_step, use_fp8_padding=True): rows are padded to a multiple of
    # lcm(tp, 16) at cp 1, so every packed width is micro batch x such a row.
    row = math.lcm(facts.tp, 16)
    max_seqlen = -(-facts.seq_length // row) * row
    return max_seqlen, mbs * max_seqlen, mbs * row


def _packed_budgets(
    cfg: CudaGraphConfig, facts: ModelFacts, packing: PackingFacts, *, max_tokens: int, multiple: int
) -> tuple[tuple[int, ...], bool]:
    """The packed token budgets and whether the plan derived them (the block's are checked by
    :func:`~bridge_cudagraph.plan.checks.check_packed_budgets`)."""
    if cfg.language.token_budgets is not None:
        return tuple(cfg.language.token_budgets), False
    if packing.mode == "offline":
        return (facts.seq_length,), True
    if packing.fixed_width:
        return (max_tokens,), True
    return tuple(derive_language_budgets(max_tokens, multiple)), True


def _packed_static_inputs(
    facts: ModelFacts, budgets: tuple[int, ...], *, cu_length: int, separate_padded: bool
) -> tuple[tuple[int, tuple[StaticInput, ...]], ...]:
    """Per budget, the static inputs of a packed layer graph."""
    tp = facts.sequence_split
    cu = (cu_length,)
    # mRoPE has one rotary row per token; RoPE one per position inside a sequence (the fused THD kernel indexes it
    # by position), which the static table holds for every position up to the budget.
    rotary_note = "(mRoPE)" if facts.position_embedding_type == "mrope" else "(RoPE, by position in its sequence)"
    return tuple(
        (
            b,
            (
                StaticInput(
                    "hidden_states", (b // tp, 1, facts.hidden_size), facts.dtype, ("T/tp" if tp > 1 else "T", "", "H")
                ),
                StaticInput("rotary_pos_emb", (b, 1, 1, facts.rotary_dim), "fp32", ("T", "", "", ""), rotary_note),
                StaticInput("cu_seqlens", cu, "int32"),
                *((StaticInput("cu_seqlens_padded", cu, "int32"),) if separate_padded else ()),
            ),
        )
        for b in budgets
    )


def _tight(cfg: CudaGraphConfig, facts: ModelFacts, packing: PackingFacts) -> tuple[bool, str]:
    """Whether the packed replay packs rows tightly (:mod:`bridge_cudagraph.capture.tight`), and why
    (``model.cuda_graph.language.tight_packing``): only on the Qwen3-VL step's rows of varying width, at pipeline
    parallel 1 without sequence parallelism, where the forward's copies on the CPU give the rows' extents
    (``forward.positions``), and not on an MoE model (its router's losses are statistics over every routed token,
    each row's padding included); ``true`` where it cannot work is refused with the reason."""
    asked = cfg.language.tight_packing
    if asked is False:
        return False, "off: language.tight_packing=false"
    if packing.mode != "qwen3_vl_step" or facts.vision is None:
        cannot = "off: only the Qwen3-VL step's rows are padded to the longest"
    elif packing.fixed_width:
        cannot = "off: every row is padded to seq_length (pp > 1 or ep > 1), one budget"
    elif facts.num_moe_experts:
        # Bridge's step routes each row's padding too: the router's losses count those tokens, so dropping them would
        # change the auxiliary and z losses (a dense layer's kept tokens never see them).
        cannot = "off: MoE routing losses count each row's padding tokens, as Bridge's step routes them"
    elif facts.pp > 1 or facts.sequence_parallel:
        cannot = "off: pipeline or sequence parallelism"
    elif cfg.forward.positions is False:
        cannot = "off: the rows' lengths come from forward.positions' host copies, which is false"
    else:
        return True, "on: each row's padding tail is dropped before the layers (forward.positions' host copies)"
    if asked:
        where = "model.cuda_graph.language.tight_packing"
        raise CudaGraphConfigError(
            f"{where}=true cannot work here: {cannot.removeprefix('off: ')}; set it to null (or false)",
            fix=(f"{where}=null",),
        )
    return False, cannot


def _plan_packed(
    cfg: CudaGraphConfig,
    facts: ModelFacts,
    packing: PackingFacts,
    *,
    mbs: int,
    num_mb: int,
    deterministic: bool = False,
) -> PackedLanguagePlan:
    """The packed language graphs' budgets and static shapes, or a refusal with the setting and the fix."""
    check_packed_language(cfg, facts, packing, mbs)
    offline = packing.mode == "offline"
    row_width, max_tokens, multiple = _packed_widths(facts, packing, mbs)
    budgets, derived = _packed_budgets(cfg, facts, packing, max_tokens=max_tokens, multiple=multiple)
    sequences, sequences_source = cfg.language.max_sequences, ""
    if sequences is None:
        sequences = offline_max_sequences(facts.seq_length) if offline else mbs
        sequences_source = f"model.seq_length {facts.seq_length} // 32" if offline else "the micro-batch size"
    max_seqlen, seqlen_source, budgets_source, workspace = row_width, "", "", 0
    if deterministic:
        budgets, max_seqlen, seqlen_source, budgets_source, workspace = _deterministic_packed(
            facts, budgets, derived, sequences, row_width
        )
    layout = PackedLayout(budgets, max_sequences=sequences, max_seqlen=max_seqlen)
    tight, tight_source = _tight(cfg, facts, packing)
    return PackedLanguagePlan(
        token_budgets=budgets,
        budgets_derived=derived,
        max_tokens=max_tokens,
        multiple=multiple,
        max_sequences=sequences,
        max_seqlen=max_seqlen,
        separate_padded=packing.separate_padded,
        offline=offline,
        static_inputs=_packed_static_inputs(
            facts, budgets, cu_length=layout.cu_seqlens_length, separate_padded=packing.separate_padded
        ),
        copies=1 if facts.pp == 1 else in_flight_microbatches(facts.pp, num_mb),
        sequences_source=sequences_source,
        tight=tight,
        tight_source=tight_source,
        row_width=row_width,
        max_seqlen_source=seqlen_source,
        deterministic_workspace=workspace,
        budgets_source=budgets_source,
    )


def _deterministic_packed(
    facts: ModelFacts, budgets: tuple[int, ...], derived: bool, sequences: int, row_width: int
) -> tuple[tuple[int, ...], int, str, str, int]:
    """The packed language graphs' static shape under TE's deterministic kernels
    (:mod:`bridge_cudagraph.plan.determinism`): ``(budgets, max_seqlen, why max_seqlen is below row_width, why
    budgets were dropped, workspace)``, the reasons empty where nothing changed. A derived ladder keeps its rungs
    whose workspace is within the derived limit (a larger micro-batch runs eagerly); a set ladder's workspace is
    counted, not limited. The rows' width is the data path's, never a setting, so ``max_seqlen`` is then lowered
    below TE's unfused threshold at the kept top, in steps of Bridge's row rounding (a micro-batch with a longer row
    runs eagerly, on the backend eager picks for it). Refused, with the fix, where not even one rung or one rounding
    step fits."""
    heads = facts.num_attention_heads // facts.tp
    step = math.lcm(facts.tp, 16)
    where = "model.cuda_graph.language"

    def segments_at(seqlen: int, top: int) -> int:
        return PackedLayout((top,), max_sequences=sequences, max_seqlen=seqlen).cu_seqlens_length - 1

    def fused_seqlen(top: int) -> tuple[int, str]:
        fits = deterministic_max_seqlen(row_width, heads, lambda seqlen: segments_at(seqlen, top), multiple=step)
        if fits == row_width:
            return fits, ""
        why = why_lowered(segments_at(row_width, top), heads, row_width)
        if fits < step:
            raise CudaGraphConfigError(
                f"{where}: {why}, and no static max_seqlen of {step} tokens or more avoids it with {sequences} "
                f"sequences per micro-batch and budgets up to {top} tokens; set {where}.token_budgets or "
                f"{where}.max_sequences lower, or {where}.enabled=false for deterministic runs",
                fix=(f"{where}.enabled=false",),
            )
        return (
            fits,
            f"lowered from {row_width} for deterministic kernels: {why}; a micro-batch with a longer row runs eagerly",
        )

    fits, seqlen_source = fused_seqlen(budgets[-1])
    budgets_source = ""
    if derived:
        kept, why = cut_derived_ladder(budgets, heads, lambda top: segments_at(min(fits, top), top))
        if why:
            if not kept:
                raise CudaGraphConfigError(
                    f"{where}: {why}, and no budget fits with {sequences} sequences per micro-batch; set "
                    f"{where}.token_budgets or {where}.max_sequences lower, or {where}.enabled=false for "
                    "deterministic runs",
                    fix=(f"{where}.enabled=false",),
                )
            budgets_source = dropped_source(kept, why)
            budgets = kept
            fits, seqlen_source = fused_seqlen(budgets[-1])  # fewer tail pieces at the kept top
    workspace = workspace_bytes(segments_at(fits, budgets[-1]), heads, budgets[-1])
    return budgets, fits, seqlen_source, budgets_source, workspace


def _plan_padded(facts: ModelFacts, *, mbs: int, num_mb: int) -> PaddedLanguagePlan:
    """Padded micro-batches on the ladder: one rung of every micro-batch's shape, a copy per micro-batch in flight."""
    return PaddedLanguagePlan(
        rows=mbs,
        width=facts.seq_length // facts.cp,
        copies=1 if facts.pp == 1 else in_flight_microbatches(facts.pp, num_mb),
        static_inputs=_padded_static_inputs(facts, mbs),
    )


def build_plan(
    facts: ModelFacts,
    cfg: CudaGraphConfig,
    *,
    world_size: int,
    micro_batch_size: int,
    global_batch_size: int | None,
    packing: PackingFacts | None = None,
    training: TrainingFacts | None = None,
    images: ImageFacts | None = None,
    deterministic: bool | None = None,
) -> CapturePlan:
    """Decide what will be captured, or refuse with an error that names the setting and the fix.

    Args:
        facts: The model (see :func:`model_facts`).
        cfg: The ``model.cuda_graph`` block.
        world_size: Ranks of the job.
        micro_batch_size: ``train.micro_batch_size``.
        global_batch_size: ``train.global_batch_size`` (None when unset).
        packing: How the data path packs (None: every micro-batch padded to ``seq_length``).
        training: What the training setup adds to the weights' memory; None: no memory estimate in the plan.
        images: The most pixels of one image on the run's data path, which ``vision.max_patches_per_image`` defaults
            to (None: unknown, the largest vision budget).
        deterministic: Whether TE's attention is built deterministic (None: this process's
            ``NVTE_ALLOW_NONDETERMINISTIC_ALGO``, :func:`~bridge_cudagraph.plan.determinism.deterministic_kernels`);
            the static attention shapes then keep cuDNN's deterministic workspace within limits.

    Returns:
        The plan.

    Raises:
        CudaGraphConfigError: A setting cannot be graphed (the message shows the arithmetic and the fix).
        LayoutError: The parallel sizes do not fit the world size.
    """
    cfg.validate("model.cuda_graph")
    _check_positive("world size", world_size)
    _check_positive("train.micro_batch_size", micro_batch_size)
    if global_batch_size is not None:
        _check_positive("train.global_batch_size", global_batch_size)
    check_model(facts, cfg)
    resolved = _resolve_layouts(cfg, facts, world_size)
    dp = resolved[Submodule.LANGUAGE].dp
    num_mb, num_mb_source = _microbatches(cfg, facts, mbs=micro_batch_size, gbs=global_batch_size, dp=dp)
    language_warmup, vision_warmup = _warmups(cfg, facts)
    deterministic = deterministic_kernels() if deterministic is None else deterministic
    language = _plan_language(
        cfg, facts, packing, mbs=micro_batch_size, num_mb=num_mb, warmup=language_warmup, deterministic=deterministic
    )
    vision = None
    if facts.vision is not None:
        vision = _plan_vision(
            cfg,
            facts,
            facts.vision,
            mbs=micro_batch_size,
            num_mb=num_mb,
            warmup=vision_warmup,
            pixels=images,
            deterministic=deterministic,
        )
    cached_walks, forward = _cached_walks(cfg), _forward(cfg, facts)
    plan = CapturePlan(
        facts=facts,
        world_size=world_size,
        micro_batch_size=micro_batch_size,
        global_batch_size=global_batch_size,
        num_microbatches=num_mb,
        layouts=tuple(resolved.values()),
        language=language,
        vision=vision,
        on_capture_error=cfg.on_capture_error,
        cached_walks=cached_walks,
        forward=forward,
        num_microbatches_source=num_mb_source,
        switches_defaulted=_defaulted(cfg, cached_walks, forward),
    )
    if training is None:
        return plan
    return dataclasses.replace(plan, memory=estimate(plan, training))


def _cached_walks(cfg: CudaGraphConfig) -> CachedWalksPlan:
    """``model.cuda_graph.cached_walks`` resolved: each walk done once wherever graphs are, unless turned off."""
    return CachedWalksPlan(**{w: cfg.any_enabled and getattr(cfg.cached_walks, w) is not False for w in CACHED_WALKS})


def _forward(cfg: CudaGraphConfig, facts: ModelFacts) -> ForwardPlan:
    """``model.cuda_graph.forward`` resolved: each part on wherever graphs are on a Qwen3-VL model, unless turned off
    or it needs a part that is off (the flat rows carry the positions' explicit mRoPE positions; ``true`` against
    ``false`` was refused by the block's own check)."""
    if not cfg.any_enabled or facts.vision is None:
        return ForwardPlan()
    on = {part: getattr(cfg.forward, part) is not False for part in FORWARD_PARTS}
    why = {part: f"forward.{part}=false" for part in FORWARD_PARTS if not on[part]}
    if on["flat_rows"] and not on["positions"]:
        on["flat_rows"] = False
        why["flat_rows"] = "needs forward.positions, which is false"
    return ForwardPlan(**on, off_reasons=tuple((part, why[part]) for part in FORWARD_PARTS if part in why))


def _defaulted(cfg: CudaGraphConfig, cached_walks: CachedWalksPlan, forward: ForwardPlan) -> tuple[str, ...]:
    """The switches of the block left null that the plan turns on, as their names in the block."""
    walks = [
        f"cached_walks.{w}" for w in CACHED_WALKS if getattr(cached_walks, w) and getattr(cfg.cached_walks, w) is None
    ]
    return (*walks, *(f"forward.{p}" for p in forward.parts if getattr(cfg.forward, p) is None))


def _resolve_layouts(cfg: CudaGraphConfig, facts: ModelFacts, world_size: int) -> dict[Submodule, ResolvedLayout]:
    """The language model's layout and, for a model with an encoder, the vision encoder's, at ``world_size``."""
    v = facts.vision
    return resolve_submodules(
        ParallelLayout(tp=facts.tp, cp=facts.cp, pp=facts.pp, ep=facts.ep, etp=facts.etp),
        None
        if v is None
        else VisionLayout(
            tp=cfg.vision.tensor_parallel_size,
            num_attention_heads=v.num_heads,
            vision_dp_when_cp=facts.vision_dp_when_cp,
        ),
        world_size,
    )


def _microbatches(
    cfg: CudaGraphConfig, facts: ModelFacts, *, mbs: int, gbs: int | None, dp: int
) -> tuple[int | None, str]:
    """Micro-batches per step and, when derived, how: needed by language graphs (their capture schedule) and by
    vision graphs under a pipeline (their copies in flight)."""
    needed_by = None
    if cfg.language.enabled:
        needed_by = "model.cuda_graph.language.enabled=true"
    elif cfg.vision.enabled and facts.pp > 1:
        needed_by = f"model.cuda_graph.vision.enabled=true with pipeline size {facts.pp} (graph copies in flight)"
    num_mb = _derive_num_microbatches(cfg, mbs=mbs, gbs=gbs, dp=dp, needed_by=needed_by)
    if num_mb is not None and cfg.num_microbatches is None:
        return num_mb, f"{gbs} / ({mbs} x dp {dp})"
    return num_mb, ""


def _plan_language(
    cfg: CudaGraphConfig,
    facts: ModelFacts,
    packing: PackingFacts | None,
    *,
    mbs: int,
    num_mb: int | None,
    warmup: tuple[int, str],
    deterministic: bool = False,
) -> LanguagePlan:
    """The language graphs: which layers each stage captures, in which runs, with which static inputs."""
    lang = cfg.language
    modules = tuple(lang.modules) if lang.modules is not None else None
    modules_source = ""
    if lang.enabled and modules is None and facts.num_moe_experts:
        modules, modules_source = language_modules(None, facts.num_moe_experts), MOE_SCOPE_SOURCE
    steps, source = warmup
    if not lang.enabled:
        return LanguagePlan(False, modules, (), (), 0, (), steps)
    check_sequence_split(facts)
    stages = _stage_layers(facts, "model.cuda_graph.language")
    # Every layer is captured: whole, or of an MoE layer its attention (check_language_ladder refused other scopes).
    graphable = [list(range(len(layers))) for layers in stages]
    captured = tuple(len(local) for local in graphable)
    assert num_mb is not None  # language graphs need it (_microbatches)
    packed = None
    if packing is not None:
        packed = _plan_packed(cfg, facts, packing, mbs=mbs, num_mb=num_mb, deterministic=deterministic)
        per_unit = len(packed.token_budgets) * packed.copies
    padded = None
    if packing is None:
        check_padded(cfg, facts)
        padded = _plan_padded(facts, mbs=mbs, num_mb=num_mb)
        per_unit = padded.copies
    unit, unit_source = _language_unit(cfg, facts)
    if facts.num_moe_experts and unit_source:
        unit_source = "each MoE layer's MLP half runs eagerly after its graph"
    merges = deepstack_merges(facts)
    segments = tuple(
        language_segments(len(local), merges, first_stage=stage == 0, unit=unit)
        if unit == "run"
        else tuple((i, i + 1) for i in local)
        for stage, local in enumerate(graphable)
    )
    return LanguagePlan(
        enabled=True,
        modules=modules,
        layers_per_stage=tuple(len(s) for s in stages),
        captured_per_stage=captured,
        graphs_per_unit=per_unit,
        graphs_per_stage=tuple(len(units) * per_unit for units in segments),
        warmup_steps=steps,
        packed=packed,
        padded=padded,
        graph_unit=unit,
        deepstack_merges=merges,
        segments_per_stage=segments,
        warmup_source=source,
        unit_source=unit_source,
        modules_source=modules_source,
    )
