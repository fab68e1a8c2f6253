"""Vision token budgets: the static lengths (in patches) vision graphs are captured at. Pure integer math.

Units: the vision transformer layers run on *patches* (``t * h * w`` per image, grid in patches), before the
``spatial_merge_size**2`` merge into language tokens. Upstream's default (``num_position_embeddings //
spatial_merge_size**2`` = 576) is in merged-token units, so any micro-batch above 576 patches fails there.
"""

from __future__ import annotations

from collections.abc import Sequence

#: How many budgets a derived ladder has: the largest and three halvings.
LADDER_STEPS = 4
#: Smallest image assumed when deriving the per-micro-batch frame limit: 4 x 4 merged tokens.
MIN_IMAGE_MERGED_TOKENS = 16


def round_up(value: int, multiple: int) -> int:
    """``value`` rounded up to a multiple of ``multiple``."""
    return -(-value // multiple) * multiple


def max_patches_per_microbatch(seq_length: int, micro_batch_size: int, merge: int) -> int:
    """Upper bound on the patches one micro-batch can carry: every image token of every sample is one merged
    token, i.e. ``merge**2`` patches, and a sample holds at most ``seq_length`` tokens."""
    return seq_length * micro_batch_size * merge * merge


def derive_token_budgets(seq_length: int, micro_batch_size: int, merge: int) -> list[int]:
    """A ladder of :data:`LADDER_STEPS` budgets: the bound of :func:`max_patches_per_microbatch` and its halvings,
    each a multiple of ``merge**2``, ascending. Smaller micro-batches use a smaller graph (attention is
    quadratic in the budget), anything up to the bound replays."""
    unit = merge * merge
    top = max_patches_per_microbatch(seq_length, micro_batch_size, merge)
    ladder = {round_up(max(unit, top >> step), unit) for step in range(LADDER_STEPS)}
    return sorted(ladder)


def derive_max_segments(budgets: list[int], merge: int) -> int:
    """Image frames a micro-batch may hold and still replay, when not configured: the largest budget filled
    with images of :data:`MIN_IMAGE_MERGED_TOKENS` merged tokens. It sizes the static ``cu_seqlens``."""
    return max(1, budgets[-1] // (merge * merge * MIN_IMAGE_MERGED_TOKENS))


def check_token_budgets(budgets: Sequence[int], spatial_merge_size: int, where: str) -> None:
    """Refuse budgets that cannot hold an image or are in merged-token units, showing the arithmetic.

    The one check the provider's ``finalize()``, ``build_plan`` and the vision helper all use.
    """
    from bridge_cudagraph.config import CudaGraphConfigError

    merge = spatial_merge_size * spatial_merge_size
    for i, b in enumerate(budgets):
        name = f"{where}.token_budgets[{i}]"
        if b < merge:
            raise CudaGraphConfigError(
                f"{name}={b} is smaller than the smallest image: one merged token is spatial_merge_size**2 = "
                f"{spatial_merge_size}**2 = {merge} patches; use budgets >= {merge}"
            )
        if b % merge:
            raise CudaGraphConfigError(
                f"{name}={b} is not a multiple of spatial_merge_size**2 = {merge} ({b} % {merge} = {b % merge}): "
                f"budgets count patches, not merged tokens; round up to {round_up(b, merge)}, or if this looks "
                f"like merged-token units multiply by {merge}: {b * merge}"
            )


def in_flight_microbatches(pipeline_parallel_size: int, num_microbatches: int) -> int:
    """Micro-batches the first pipeline stage holds between their forward and their backward.

    Megatron's 1F1B schedule runs ``pp - rank - 1`` warmup forwards, then one more forward before each backward,
    so stage 0 holds at most ``min(pp, num_microbatches)``; without a pipeline, one. Each in-flight micro-batch
    needs its own copy of the vision graphs: a replay overwrites the static activations the previous
    micro-batch's backward still needs (megatron-core keeps one graph per micro-batch for the same reason).
    """
    if pipeline_parallel_size < 1 or num_microbatches < 1:
        raise ValueError(f"pipeline size {pipeline_parallel_size} and micro-batches {num_microbatches} must be >= 1")
    return 1 if pipeline_parallel_size == 1 else min(pipeline_parallel_size, num_microbatches)
