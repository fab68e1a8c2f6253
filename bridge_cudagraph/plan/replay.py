"""Whether a plan's graphs can ever replay: the checks that need the whole plan, once it is built.

:func:`~bridge_cudagraph.plan.build.build_plan` decides what to capture from settings that are each valid on their
own. Together with the data path and the run's length they can still describe graphs that nothing uses: a capture
step the run never reaches, a ladder rung no micro-batch is narrow or wide enough for, a per-image limit below the
smallest image. Such a plan costs capture time and graph memory and trains eagerly; it is not "ok". Every setting
the plan cannot use is refused here, in one line that names it and a fix (``CudaGraphConfigError.fix``: the
overrides of that fix, which validate), and so is a plan whose smallest capture no GPU holds.

Only what is certain from the configuration is refused: the bounds are the data path's own (the rows of Bridge's
Qwen3-VL step, the smallest image its collate makes, or one merged token where that is unknown), so a plan refused
here could not have replayed on any data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge_cudagraph.config import CudaGraphConfigError
from bridge_cudagraph.plan.budgets import round_up

if TYPE_CHECKING:
    from bridge_cudagraph.plan.capture_plan import CapturePlan
    from bridge_cudagraph.plan.facts import ImageFacts

__all__ = ["LARGEST_GPU_GIB", "check_below_any_gpu", "check_replays"]

#: The most memory one GPU holds: NVIDIA B300, 288 GB of HBM3e (268 GiB). A plan whose estimate per rank is above it
#: fits no GPU; a lower capacity is ``--gpu-memory``'s to check.
LARGEST_GPU_GIB = 268

#: Tokens a packed row holds at least: Bridge's Qwen3-VL step pads every row to a multiple of 16 (``use_fp8_padding``)
#: and tight packing rounds each row's extent to 16.
ROW_TOKENS = 16


def check_replays(plan: CapturePlan, *, train_iters: int | None, images: ImageFacts | None = None) -> None:
    """Refuse a plan with graphs that can never replay, or whose smallest capture no GPU holds.

    Args:
        plan: The plan, built.
        train_iters: ``train.train_iters`` (None: the run's length is not known here, e.g. it counts samples).
        images: What the data path does to images (:func:`~bridge_cudagraph.plan.facts.image_facts`): the smallest
            image it makes, where known, bounds the vision settings from below.

    Raises:
        CudaGraphConfigError: The setting, why nothing replays it, and the fix.
    """
    _check_capture_reached(plan, train_iters)
    if plan.language.enabled and plan.language.packed is not None:
        _check_packed(plan)
    if plan.vision is not None and plan.vision.enabled:
        _check_vision(plan, images)
    check_below_any_gpu(plan)


def _check_capture_reached(plan: CapturePlan, train_iters: int | None) -> None:
    """The lifecycle captures a submodule before step ``warmup_steps`` (counted from 0); a run of ``train_iters``
    steps must reach it and replay at least once."""
    if train_iters is None:
        return
    parts = [("language", plan.language.enabled, plan.language.warmup_steps, plan.language.warmup_source)]
    if plan.vision is not None:
        parts.append(("vision", plan.vision.enabled, plan.vision.warmup_steps, plan.vision.warmup_source))
    for name, enabled, warmup, source in parts:
        if enabled and train_iters <= warmup:
            setting = source or f"model.cuda_graph.{name}.warmup_steps"
            raise CudaGraphConfigError(
                f"train.train_iters={train_iters} ends before the {name} graphs are captured (before step {warmup}: "
                f"{setting}={warmup}), so they would never replay; set train.train_iters to at least {warmup + 1}, "
                f"or {setting} below {train_iters}",
                fix=(f"train.train_iters={warmup + 1}",),
            )


def _check_packed(plan: CapturePlan) -> None:
    """A packed micro-batch of Bridge's Qwen3-VL step holds exactly one sequence per row and between
    ``micro batch x 16`` and ``max_tokens`` tokens; an offline-packed row holds 1 to ``seq_length`` sequences."""
    packed, where = plan.language.packed, "model.cuda_graph.language"
    assert packed is not None
    mbs, seq = plan.micro_batch_size, plan.facts.seq_length
    if not packed.sequences_source:  # set in the block
        given = packed.max_sequences
        if packed.offline and given > seq:
            raise CudaGraphConfigError(
                f"{where}.max_sequences={given}: an offline-packed row of model.seq_length {seq} tokens holds at most "
                f"{seq} sequences, so the rest of the static cu_seqlens is never used; set it to {seq} or less (or "
                "null)",
                fix=(f"{where}.max_sequences=null",),
            )
        if not packed.offline and given != mbs:
            why = (
                "no micro-batch would replay"
                if given < mbs
                else "the rest of the static cu_seqlens is never used, and costs memory"
            )
            raise CudaGraphConfigError(
                f"{where}.max_sequences={given}, but every packed micro-batch of Bridge's Qwen3-VL step holds exactly "
                f"train.micro_batch_size = {mbs} sequences (one per row): {why}; set it to {mbs} or null",
                fix=(f"{where}.max_sequences=null",),
            )
    if packed.offline or packed.budgets_derived:
        return
    narrowest = mbs * ROW_TOKENS
    for i, budget in enumerate(packed.token_budgets):
        if budget < narrowest or budget > packed.max_tokens:
            bound = (
                f"below the narrowest packed micro-batch ({mbs} rows of at least {ROW_TOKENS} tokens = {narrowest})"
                if budget < narrowest
                else f"above the widest packed micro-batch ({packed.max_tokens} tokens: micro batch {mbs} x "
                f"model.seq_length {seq}, rows rounded to {packed.row_width})"
            )
            raise CudaGraphConfigError(
                f"{where}.token_budgets[{i}]={budget} is {bound}, so no micro-batch ever replays it; use budgets from "
                f"{narrowest} to {packed.max_tokens}, or token_budgets=null to derive the ladder",
                fix=(f"{where}.token_budgets=null",),
            )


def _check_vision(plan: CapturePlan, images: ImageFacts | None) -> None:
    """An image holds at least one merged token (``spatial_merge_size**2`` patches), and on a data path that resizes
    images up to ``min_pixels`` (Bridge's Qwen-VL collate) at least ``min_pixels // patch_size**2`` patches; a
    micro-batch at most :attr:`~bridge_cudagraph.plan.capture_plan.VisionPlan.max_patches_per_microbatch` patches."""
    vision, facts, where = plan.vision, plan.facts.vision, "model.cuda_graph.vision"
    assert vision is not None and facts is not None
    unit, most = facts.merge_unit, vision.max_patches_per_microbatch
    smallest, why = unit, f"one merged token is spatial_merge_size**2 = {unit} patches"
    if images is not None and images.min_pixels:
        floor = images.smallest_patches(facts.patch_size)
        if floor > smallest:
            smallest = floor
            why = (
                f"the data path resizes every image to at least min_pixels {images.min_pixels} = {floor} patches of "
                f"{facts.patch_size}x{facts.patch_size} ({images.source})"
            )
    if smallest > most:
        tokens = -(-smallest // unit)
        raise CudaGraphConfigError(
            f"model.seq_length={plan.facts.seq_length} cannot hold one image: {why}, {tokens} merged tokens, but a "
            f"micro-batch of {plan.micro_batch_size} samples of model.seq_length tokens carries at most {most} "
            f"patches, so the vision graphs would never replay; set {where}.enabled=false, or model.seq_length and "
            f"dataset.seq_length to more than {tokens}",
            fix=(f"{where}.enabled=false",),
        )
    if not vision.patches_source and vision.max_patches_per_image < smallest:
        raise CudaGraphConfigError(
            f"{where}.max_patches_per_image={vision.max_patches_per_image} is below the smallest image: {why}, so no "
            f"image would replay; set it to {smallest} or more (or null: the data path's max_pixels)",
            fix=(f"{where}.max_patches_per_image=null",),
        )
    if not vision.budgets_derived:
        below = [b for b in vision.token_budgets if b < smallest]
        if below:
            kept = [b for b in vision.token_budgets if b >= smallest] or [round_up(smallest, unit)]
            raise CudaGraphConfigError(
                f"{where}.token_budgets {below} are below the smallest image: {why}, so no micro-batch with an image "
                f"ever replays them; set token_budgets={kept} (or null to derive the ladder)",
                fix=(f"{where}.token_budgets=[{','.join(map(str, kept))}]",),
            )
    if not vision.budgets_derived:
        above = [b for b in vision.token_budgets if b > most]
        if above:
            kept = sorted({*(b for b in vision.token_budgets if b <= most), most})
            raise CudaGraphConfigError(
                f"{where}.token_budgets {above} are above the most patches a micro-batch can carry: model.seq_length "
                f"{plan.facts.seq_length} x micro batch {plan.micro_batch_size} tokens x {unit} patches per merged "
                f"token = {most}; a larger graph is never filled and costs memory for nothing; set "
                f"token_budgets={kept} (or null to derive the ladder)",
                fix=(f"{where}.token_budgets=[{','.join(map(str, kept))}]",),
            )
    if not vision.images_derived and vision.max_images_per_microbatch > most // unit:
        raise CudaGraphConfigError(
            f"{where}.max_images_per_microbatch={vision.max_images_per_microbatch}, but a micro-batch of at most "
            f"{most} patches holds at most {most // unit} images of one merged token ({unit} patches) each: the rest "
            f"of the static cu_seqlens is never used; set it to {most // unit} or less (or null)",
            fix=(f"{where}.max_images_per_microbatch=null",),
        )


def check_below_any_gpu(plan: CapturePlan) -> None:
    """Refuse a plan whose smallest capture no GPU holds: the estimate per rank (:mod:`bridge_cudagraph.plan.memory`)
    with each ladder at its lowest rung, above :data:`LARGEST_GPU_GIB`. A ladder's upper rungs are captured only for
    micro-batches that need them, and only where the memory is free (``LadderHelper.capture_pending``), so its top is
    no certain cost; the weights, their gradients and optimizer state, the logits and the padded graphs are. Nothing
    to check for a plan without the training facts."""
    from bridge_cudagraph.plan.memory import GIB, pool_estimate

    memory = plan.memory
    if memory is None:
        return
    language = memory.language_graphs
    if memory.language_ladder and plan.language.packed is not None:
        language = pool_estimate(plan, "language", plan.language.packed.token_budgets[0])
    vision = 0
    if plan.vision is not None and plan.vision.enabled:
        vision = pool_estimate(plan, "vision", plan.vision.token_budgets[0])
    need, capacity = memory.static + memory.logits + language + vision, LARGEST_GPU_GIB * GIB
    if need <= capacity:
        return
    # Where the graphs make the difference, the change of the block that leads under: the larger pool's graphs off
    # (the next refusal, if any, names the other); where the run does not fit without graphs either, none does.
    pool, name = max((language, "language"), (vision, "vision"))
    off = name if pool and memory.static + memory.logits <= capacity else None
    fix = () if off is None else (f"model.cuda_graph.{off}.enabled=false",)
    first = f"set model.cuda_graph.{off}.enabled=false (its graphs take the most), or " if off else "set "
    raise CudaGraphConfigError(
        f"the run needs at least about {need / GIB:.1f} GiB per rank even at its smallest graphs (weights, gradients "
        f"and optimizer {memory.static / GIB:.1f}, logits {memory.logits / GIB:.1f}, graph pools: language "
        f"{language / GIB:.1f}, vision {vision / GIB:.1f}), and no GPU holds more than {LARGEST_GPU_GIB} GiB (NVIDIA "
        f"B300, 288 GB); {first}train.micro_batch_size or model.seq_length lower, or use more ranks "
        "(model.tensor_model_parallel_size, model.pipeline_model_parallel_size)",
        fix=fix,
    )
