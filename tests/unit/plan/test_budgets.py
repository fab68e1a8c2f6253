"""The derived token-budget ladders (``bridge_cudagraph.plan.budgets``): one geometric derivation for the packed
language ladder and the vision ladder, its padding bound, and the vision ladder's units and floor."""

from __future__ import annotations

import bisect
import itertools

import pytest

from bridge_cudagraph.plan.budgets import (
    LADDER_RATIO,
    derive_language_budgets,
    derive_max_segments,
    derive_token_budgets,
    geometric_ladder,
    max_patches_per_microbatch,
    round_up,
    vision_ladder_multiple,
)

pytestmark = pytest.mark.fast


def _rung(ladder: list[int], size: int) -> int:
    """The rung a micro-batch of ``size`` replays in: the smallest that holds it."""
    return ladder[bisect.bisect_left(ladder, size)]


@pytest.mark.parametrize(
    ("largest", "multiple", "floor_fraction"),
    [
        (8192, 32, 1 / 16),
        (4096, 32, 1 / 16),
        (1000, 48, 1 / 16),
        (32768, 64, 1 / 64),
        (2048, 64, 1 / 64),
        (27000, 72, 1 / 64),
        (5000, 64, 1 / 2),
        (64, 64, 1 / 64),
        (1, 16, 1 / 16),
    ],
)
def test_geometric_ladder_pads_at_most_a_fifth_above_its_floor(largest, multiple, floor_fraction):
    """Ascending, distinct multiples of ``multiple``; the top is ``largest`` rounded up, the bottom the floor; every
    size above the floor replays in a rung at most 1.25x it, or, where rungs are one ``multiple`` apart (below
    5 multiples, the ratio needs a finer step than the multiple), less than one ``multiple`` above it."""
    ladder = geometric_ladder(largest, multiple, floor_fraction)
    assert ladder == sorted(set(ladder)) and all(b % multiple == 0 for b in ladder)
    assert ladder[-1] == round_up(largest, multiple)
    floor = max(multiple, round_up(int(ladder[-1] * floor_fraction), multiple))
    assert ladder[0] == floor
    for size in range(1, ladder[-1] + 1):
        rung = _rung(ladder, size)
        if size <= floor:
            assert rung == floor
        elif size >= 4 * multiple:
            assert rung <= LADDER_RATIO * size, (size, rung)
        else:
            assert rung <= LADDER_RATIO * size or rung - size < multiple, (size, rung)
    assert all(b / a <= LADDER_RATIO for a, b in itertools.pairwise(ladder) if b >= 5 * multiple)


def test_the_language_ladder_is_the_geometric_ladder_down_to_a_sixteenth():
    """Pinned: mbs 2 x S 4096 in steps of mbs x 16 (Bridge's packed widths); each rung divided by 1.25 and rounded
    *up* to 32, so no gap is more than 1.25x (rounding down gave 6528 -> 8192, 1.255x)."""
    assert derive_language_budgets(8192, 32) == [
        *(512, 640, 768, 928, 1152, 1408, 1760, 2176, 2720, 3392, 4224, 5248, 6560, 8192)
    ]
    assert derive_language_budgets(1000, 48)[-1] == 1008
    assert derive_language_budgets(8192, 32) == geometric_ladder(8192, 32, 1 / 16)


def test_the_vision_multiple_is_64_patches_in_whole_merged_tokens():
    """64 patches (16 merged tokens at merge 2), rounded up to a multiple of merge**2 where 64 is not one."""
    assert [vision_ladder_multiple(m) for m in (1, 2, 3, 4, 8, 9)] == [64, 64, 72, 64, 64, 81]
    assert all(vision_ladder_multiple(m) % (m * m) == 0 for m in range(1, 12))


@pytest.mark.parametrize(
    ("seq", "mbs", "merge"), [(4096, 2, 2), (4096, 1, 2), (256, 2, 2), (1000, 3, 2), (1000, 3, 3)]
)
def test_the_vision_ladder_runs_from_a_64th_of_the_bound_to_the_bound(seq, mbs, merge):
    """Rungs multiples of :func:`vision_ladder_multiple` (so of merge**2), the top the bound rounded up to it, the
    bottom a 64th of it; :func:`derive_max_segments` reads the top."""
    ladder = derive_token_budgets(seq, mbs, merge)
    unit = vision_ladder_multiple(merge)
    bound = max_patches_per_microbatch(seq, mbs, merge)
    assert ladder == geometric_ladder(bound, unit, 1 / 64)
    assert ladder[-1] == round_up(bound, unit) and all(b % unit == 0 and b % (merge * merge) == 0 for b in ladder)
    assert ladder[0] == max(unit, round_up(ladder[-1] // 64, unit))
    assert derive_max_segments(ladder, merge) == max(1, ladder[-1] // (merge * merge * 16))


def test_photo_microbatches_pad_to_a_near_rung_not_to_a_halving_of_the_bound():
    """Qwen3-VL at seq 4096 x mbs 2: a 32768-patch bound. The 2B photo set's micro-batches carry 1616-3144 patches;
    halvings of the bound (4096 at the bottom) padded all of them to 4096, the geometric ladder pads each by at
    most a fifth of its rung."""
    ladder = derive_token_budgets(4096, 2, 2)
    assert ladder[0] == 512 and ladder[-1] == 32768 and len(ladder) == 21
    assert all(_rung(ladder, size) <= 1.25 * size for size in range(1616, 3145, 4))
    assert _rung(ladder, 1616) == 1920 and _rung(ladder, 3144) == 3648
