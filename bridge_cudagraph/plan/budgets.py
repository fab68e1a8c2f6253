"""Token budgets: the static lengths graphs of packed inputs are captured at. Pure integer math.

Vision budgets count patches; packed language budgets (:class:`PackedLayout`) count tokens.

Units: the vision transformer layers run on *patches* (``t * h * w`` per image, grid in patches), before the
``spatial_merge_size**2`` merge into language tokens. Upstream's default (``num_position_embeddings //
spatial_merge_size**2`` = 576) is in merged-token units, so any micro-batch above 576 patches fails there.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

#: Smallest image assumed when deriving the per-micro-batch frame limit: 4 x 4 merged tokens.
MIN_IMAGE_MERGED_TOKENS = 16


def round_up(value: int, multiple: int) -> int:
    """``value`` rounded up to a multiple of ``multiple``."""
    return -(-value // multiple) * multiple


def max_patches_per_microbatch(seq_length: int, micro_batch_size: int, merge: int) -> int:
    """Upper bound on the patches one micro-batch can carry: every image token of every sample is one merged
    token, i.e. ``merge**2`` patches, and a sample holds at most ``seq_length`` tokens."""
    return seq_length * micro_batch_size * merge * merge


def vision_ladder_multiple(merge: int) -> int:
    """The step between derived vision budgets, in patches: :data:`VISION_LADDER_MULTIPLE` rounded up to a
    multiple of ``merge**2`` (64 at merge 2, 72 at merge 3). A budget must be a multiple of ``merge**2`` (whole
    merged tokens); 64 patches at merge 2 is 16 merged tokens, the smallest image assumed
    (:data:`MIN_IMAGE_MERGED_TOKENS`): fine enough that the ratio bound holds from five multiples (320 patches) up,
    coarse enough that the small rungs are not one merged token apart."""
    unit = merge * merge
    return round_up(max(VISION_LADDER_MULTIPLE, unit), unit)


def derive_token_budgets(seq_length: int, micro_batch_size: int, merge: int) -> list[int]:
    """The vision ladder: :func:`geometric_ladder` up to the bound of :func:`max_patches_per_microbatch`, rungs
    multiples of :func:`vision_ladder_multiple`, down to :data:`VISION_LADDER_FLOOR` of the bound, ascending.

    The bound is what the longest sequence could carry if every token were an image token; real photo
    micro-batches carry a small part of it (the 2B photo set's 1616-3144 patches of a 32768 bound), so the floor
    sits far below the top: halvings of the bound would pad such a micro-batch to 4096, and halvings of the data's
    own largest pad up to half of a budget. Smaller micro-batches use a smaller graph (attention is quadratic in the
    budget), anything up to the bound replays.
    """
    top = max_patches_per_microbatch(seq_length, micro_batch_size, merge)
    return geometric_ladder(top, vision_ladder_multiple(merge), VISION_LADDER_FLOOR)


def derive_max_segments(budgets: list[int], merge: int, smallest: int | None = None) -> int:
    """Image frames a micro-batch may hold and still replay, when not configured: the largest budget filled with the
    smallest image, ``smallest`` patches where the data path resizes every image up to a floor (Bridge's Qwen-VL
    collate: ``min_pixels``), else images of :data:`MIN_IMAGE_MERGED_TOKENS` merged tokens. It sizes the static
    ``cu_seqlens``, whose every slot is a segment of the graphs' attention (and of its deterministic workspace). A
    micro-batch with more frames (video frames under a floor of their own) runs eagerly, counted."""
    per_image = max(smallest or 0, merge * merge * MIN_IMAGE_MERGED_TOKENS)
    return max(1, budgets[-1] // per_image)


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


#: A derived ladder (packed language, vision): each rung at most this much larger than the one below, so a
#: micro-batch above the floor pads at most 1 - 1/1.25 = 20% of its budget.
LADDER_RATIO = 1.25
#: The smallest rung of a derived packed-language ladder, as a fraction of its largest.
LANGUAGE_LADDER_FLOOR = 1 / 16
#: The smallest rung of a derived vision ladder, as a fraction of its largest: lower than the language's, since the
#: vision bound (every token an image token) is far above what photo micro-batches carry.
VISION_LADDER_FLOOR = 1 / 64
#: The step between derived vision budgets before rounding to whole merged tokens (:func:`vision_ladder_multiple`).
VISION_LADDER_MULTIPLE = 64


def geometric_ladder(largest: int, multiple: int, floor_fraction: float) -> list[int]:
    """Budgets up to ``largest`` rounded up to ``multiple``, each a multiple of ``multiple``, ascending, each at
    most :data:`LADDER_RATIO` times the one below (or one ``multiple`` above it where that is more), from
    ``floor_fraction`` of the top (at least ``multiple``) up. The one ladder derivation, language and vision.

    Geometric rather than even rungs or halvings: micro-batches are mostly small against the largest possible
    (one photo and an answer fill a small part of a packed sequence; a photo micro-batch a small part of the vision
    bound), and the padding a rung costs is the gap to the rung below. Halvings pad a micro-batch just above a rung
    to the next, up to half its budget; even rungs of the largest / 8 pad one just over an eighth to a quarter;
    geometric rungs at most 1 - 1 / :data:`LADDER_RATIO` = 20% at every size above the floor. More rungs cost
    capture time and each rung's own small buffers (its gradient output and last gradient input, one row per token;
    a geometric ladder's add up to about 5x the top rung's, :func:`~bridge_cudagraph.plan.memory.ladder_pool_bytes`),
    not pool memory: the rungs of a ladder share one graph pool, the size of the largest captured
    (:func:`~bridge_cudagraph.capture.ladder_capture.capture_budget_ladder`), and the first capture takes only the
    rungs up to the largest micro-batch seen before it
    (:meth:`~bridge_cudagraph.capture.budget_ladder.BudgetLadder.first_rungs`).

    Each rung below is the one above divided by the ratio, rounded *up* to the multiple (so the ratio bound
    holds), and at least one multiple below it (so small rungs, where the multiple is more than a fifth of the
    rung, still descend).
    """
    if largest < 1 or multiple < 1:
        raise ValueError(f"largest {largest} and multiple {multiple} must be >= 1")
    top = round_up(largest, multiple)
    floor = max(multiple, round_up(int(top * floor_fraction), multiple))
    ladder, budget = [top], top
    while budget > floor:
        budget = max(floor, min(budget - multiple, round_up(math.ceil(budget / LADDER_RATIO), multiple)))
        ladder.append(budget)
    return ladder[::-1]


def derive_language_budgets(max_tokens: int, multiple: int) -> list[int]:
    """The packed language ladder: :func:`geometric_ladder` up to ``max_tokens`` (the most a packed micro-batch
    carries), rungs multiples of ``multiple`` (the packed width's own rounding), down to
    :data:`LANGUAGE_LADDER_FLOOR` of the top."""
    return geometric_ladder(max_tokens, multiple, LANGUAGE_LADDER_FLOOR)


@dataclass(frozen=True, slots=True)
class PackedLayout:
    """The static shapes of packed language graphs: pure numbers, shared by the plan and the capture.

    Attributes:
        budgets: Static token counts of the decoder input, ascending (each a multiple of ``multiple``).
        max_sequences: Most real sequences (attention segments) a micro-batch may hold and still replay.
        max_seqlen: Longest segment allowed, the static ``max_seqlen`` of attention (Bridge's ``seq_length``).
    """

    budgets: tuple[int, ...]
    max_sequences: int
    max_seqlen: int

    @property
    def tail_segments(self) -> int:
        """Segments the unused tail may need: the largest budget in pieces of at most ``max_seqlen``."""
        return -(-self.budgets[-1] // self.max_seqlen)

    @property
    def cu_seqlens_length(self) -> int:
        """Entries of the static ``cu_seqlens``: the leading 0, the real boundaries, the tail's boundaries."""
        return 1 + self.max_sequences + self.tail_segments

    def budget_for(self, tokens: int, sequences: int) -> int | None:
        """The smallest budget that holds ``tokens`` in ``sequences`` segments, or None (eager)."""
        if sequences > self.max_sequences or tokens < 1:
            return None
        i = bisect.bisect_left(self.budgets, tokens)
        return self.budgets[i] if i < len(self.budgets) else None

    def tail(self, tokens: int, budget: int) -> list[int]:
        """The static ``cu_seqlens`` after the real boundaries, ``sequences`` real segments already written:
        the tail ``[tokens, budget)`` in pieces of at most ``max_seqlen``, then ``budget`` repeated."""
        ends = list(range(tokens + self.max_seqlen, budget, self.max_seqlen)) + ([budget] if tokens < budget else [])
        return ends

    def static_cu_seqlens(self, real: Sequence[int], budget: int) -> list[int]:
        """The whole static ``cu_seqlens`` for a micro-batch with boundaries ``real`` (``[0, ..., T]``), on the host.

        The replay writes the real part with a device copy instead; this is the reference layout (tests, capture).
        """
        sequences, tokens = len(real) - 1, real[-1]
        if self.budget_for(tokens, sequences) is None or budget < tokens:
            raise ValueError(f"{tokens} tokens in {sequences} sequences do not fit budget {budget} of {self}")
        out = list(real) + self.tail(tokens, budget)
        return out + [budget] * (self.cu_seqlens_length - len(out))


def language_segments(layers: int, merges: int, *, first_stage: bool, unit: str) -> tuple[tuple[int, int], ...]:
    """The layer ranges of one language chunk's graphs: Qwen3-VL's decoder adds a deepstack feature after each of
    its first ``merges`` layers on the first pipeline stage only (Bridge 0.6.2 ``Qwen3VLTransformerBlock.forward``,
    ``pre_process``), so runs are cut there and nowhere else. The plan and both language helpers derive them here."""
    return layer_segments(layers, range(merges if first_stage else 0), unit)


def layer_segments(depth: int, cut_after: Sequence[int], unit: str) -> tuple[tuple[int, int], ...]:
    """The layer ranges ``[start, end)`` one graph each spans, for a ``graph_unit`` of ``model.cuda_graph``: runs of
    layers cut after each layer of ``cut_after`` and then the rest (``run``), or single layers (``layer``).

    The cuts are where something outside the layers reads or changes their output: Qwen3-VL's vision encoder reads
    the output of each deepstack layer (its deepstack mergers), its language model adds a deepstack feature after
    each of its first layers (one per feature). A graph never spans a cut, so each graph has one input and one
    output, both the eager layers' own. The plan counts graphs with it and the captures build them with it.
    """
    if unit == "layer":
        return tuple((i, i + 1) for i in range(depth))
    if unit == "run":
        ends = sorted({t + 1 for t in cut_after if 0 <= t < depth} | {depth})
        return tuple(zip([0, *ends[:-1]], ends, strict=True)) if depth else ()
    raise ValueError(f"unknown graph unit {unit!r}")
