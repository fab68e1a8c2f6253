"""The static layout of packed (THD) language graphs: budgets, the sequence cap, and the static ``cu_seqlens``."""

from __future__ import annotations

import itertools

import pytest

from bridge_cudagraph.capture.block_replay import install_ladder_replay, remove_ladder_replay
from bridge_cudagraph.capture.packed import packed_misfit
from bridge_cudagraph.plan.budgets import PackedLayout


def test_budget_is_the_smallest_that_fits_and_none_beyond():
    layout = PackedLayout(budgets=(512, 1024, 2048), max_sequences=2, max_seqlen=1024)
    assert layout.budget_for(1, 1) == 512
    assert layout.budget_for(512, 2) == 512
    assert layout.budget_for(513, 2) == 1024
    assert layout.budget_for(2048, 2) == 2048
    assert layout.budget_for(2049, 2) is None
    assert layout.budget_for(100, 3) is None  # more sequences than the static cu_seqlens holds
    assert layout.budget_for(0, 0) is None


def test_tail_is_split_into_segments_no_longer_than_max_seqlen():
    layout = PackedLayout(budgets=(4096,), max_sequences=2, max_seqlen=1024)
    assert layout.tail_segments == 4
    assert layout.cu_seqlens_length == 1 + 2 + 4
    # 2 rows of 288 tokens: the tail [576, 4096) in pieces of at most 1024, then nothing left to pad.
    cu = layout.static_cu_seqlens([0, 288, 576], 4096)
    assert cu == [0, 288, 576, 1600, 2624, 3648, 4096]
    assert all(b - a <= 1024 for a, b in itertools.pairwise(cu))
    # A full budget has no tail: the remaining entries repeat the budget (zero-length segments).
    assert layout.static_cu_seqlens([0, 2048, 4096], 4096) == [0, 2048, 4096] + [4096] * 4
    # One sequence: one more zero-length segment at the end.
    assert layout.static_cu_seqlens([0, 100], 4096)[-1] == 4096
    assert len(layout.static_cu_seqlens([0, 100], 4096)) == layout.cu_seqlens_length


def test_static_cu_seqlens_refuses_what_does_not_fit():
    layout = PackedLayout(budgets=(1024,), max_sequences=2, max_seqlen=512)
    with pytest.raises(ValueError, match="do not fit"):
        layout.static_cu_seqlens([0, 600, 1100], 1024)
    with pytest.raises(ValueError, match="do not fit"):
        layout.static_cu_seqlens([0, 10, 20, 30], 1024)


def test_replay_class_swap_is_undone_and_keeps_state():
    import torch

    block = torch.nn.Linear(4, 4)
    keys = sorted(block.state_dict())
    original = type(block)
    install_ladder_replay(block, helper=None)
    assert type(block) is not original and isinstance(block, original)
    assert sorted(block.state_dict()) == keys
    remove_ladder_replay(block)
    assert type(block) is original
    assert "ladder_helper" not in block.__dict__


def test_load_writes_real_boundaries_then_a_tail_of_equal_lengths_in_both_forms():
    import torch
    from megatron.core.packed_seq_params import PackedSeqParams

    from bridge_cudagraph.capture.packed import PackedGraphSet

    layout = PackedLayout(budgets=(1024,), max_sequences=2, max_seqlen=512)
    n = layout.cu_seqlens_length
    graphs = PackedGraphSet(
        layers=[],
        rotary=torch.full((1024, 1, 1, 4), 7.0),
        cu_seqlens=torch.full((n,), -1, dtype=torch.int32),
        cu_seqlens_padded=torch.full((n,), -1, dtype=torch.int32),
    )
    params = PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=torch.tensor([0, 100, 200], dtype=torch.int32),
        cu_seqlens_q_padded=torch.tensor([0, 128, 256], dtype=torch.int32),
    )
    graphs.load(layout, torch.ones(256, 1, 1, 4), params, tokens=256)
    assert graphs.cu_seqlens_padded.tolist() == layout.static_cu_seqlens([0, 128, 256], 1024)
    assert graphs.cu_seqlens_padded.tolist() == [0, 128, 256, 768, 1024]
    # The unpadded form: real lengths, then tail segments as long as the padded ones.
    assert graphs.cu_seqlens.tolist() == [0, 100, 200, 712, 968]
    assert bool((graphs.rotary[:256] == 1).all()) and bool((graphs.rotary[256:] == 0).all())


def _misfit(**changes):
    """The replay's fit check of a micro-batch that fits budget 1024 of a ladder captured up to 2048 at tp 2, with
    ``changes`` applied."""
    layout = PackedLayout(budgets=(512, 1024, 2048, 4096), max_sequences=2, max_seqlen=1024)
    given = dict(tokens=900, sequences=2, form_matches=True, max_seqlen=700, width=1, rotary_shape=(900, 1, 1, 64))
    given.update(changes)
    budget = layout.budget_for(given["tokens"], given["sequences"])
    tp = given.pop("tp", 1)
    return packed_misfit(
        layout, budget, captured_top=2048, holds=budget is not None and budget <= 2048, tp=tp, **given
    )


def test_a_micro_batch_that_fits_a_captured_graph_replays():
    assert _misfit() is None
    assert _misfit(rotary_shape=(700, 1, 1, 64)) is None  # RoPE: one row per position of the longest segment


@pytest.mark.parametrize(
    ("changes", "cause", "says"),
    [
        ({"tokens": 5000}, "size", "5000 tokens in 2 sequences exceed the packed graphs (largest budget 4096"),
        ({"sequences": 3}, "size", "at most 2 sequences"),
        ({"tokens": 3000, "rotary_shape": (3000, 1, 1, 64)}, "above", "need budget 4096, above the captured top 2048"),
        ({"form_matches": False}, "form", "cu_seqlens_q_padded form differs"),
        ({"max_seqlen": 1025}, "seqlen", "a segment of 1025 tokens exceeds max_seqlen 1024"),
        ({"width": 2}, "seqlen", "exceeds max_seqlen"),
        ({"rotary_shape": None}, "rotary", "its rotary table None does not fit"),
        ({"rotary_shape": (1025, 1, 1, 64)}, "rotary", "(1025, 1, 1, 64) does not fit the static (1024, 1, 1, d)"),
        ({"rotary_shape": (900, 2, 1, 64)}, "rotary", "does not fit"),
        ({"tp": 2}, "split", "900 tokens under sequence parallelism over tp 2 are narrower than budget 1024"),
    ],
    ids=[
        "tokens",
        "sequences",
        "above",
        "form",
        "seqlen",
        "width",
        "no-rotary",
        "rotary-rows",
        "rotary-batch",
        "split",
    ],
)
def test_each_cause_of_an_eager_micro_batch_is_named(changes, cause, says):
    """Every way a packed micro-batch misses the graphs has its own cause (counted and logged once each by the
    helper) and a line that says what did not fit; the first that applies wins, in the order the replay checks."""
    got = _misfit(**changes)
    assert got is not None and got[0] == cause and says in got[1], got


def test_a_budget_the_tensor_parallel_split_cannot_cut_misses():
    layout = PackedLayout(budgets=(1000,), max_sequences=2, max_seqlen=1000)
    fit = dict(tokens=1000, sequences=1, form_matches=True, max_seqlen=900, width=1, rotary_shape=(1000, 1, 1, 8))
    assert packed_misfit(layout, 1000, captured_top=1000, holds=True, tp=16, **fit)[0] == "rotary"
    assert packed_misfit(layout, 1000, captured_top=1000, holds=True, tp=4, **fit) is None


def test_under_sequence_parallelism_only_a_micro_batch_of_its_budgets_width_replays():
    """Each rank pads its own slice of the rows at its end, so the gathered sequence would interleave padding between
    the ranks' tokens; the static cu_seqlens put the tail after all of them. Without sequence parallelism (tp 1 here)
    the same micro-batch replays."""
    layout = PackedLayout(budgets=(512, 1024), max_sequences=2, max_seqlen=1024)
    fit = dict(sequences=2, form_matches=True, max_seqlen=512, width=1)
    for tokens, tp, replays in ((1024, 2, True), (512, 4, True), (1000, 2, False), (1000, 1, True)):
        got = packed_misfit(
            layout, layout.budget_for(tokens, 2), captured_top=1024, holds=True, tp=tp,
            tokens=tokens, rotary_shape=(tokens, 1, 1, 8), **fit,
        )  # fmt: skip
        assert (got is None) == replays and (replays or got[0] == "split"), (tokens, tp, got)
