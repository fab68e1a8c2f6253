"""The static layout of packed (THD) language graphs: budgets, the sequence cap, and the static ``cu_seqlens``."""

from __future__ import annotations

import itertools

import pytest

from bridge_cudagraph.capture.packed import PackedLayout, install_packed_replay, remove_packed_replay


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
    install_packed_replay(block, helper=None)
    assert type(block) is not original and isinstance(block, original)
    assert sorted(block.state_dict()) == keys
    remove_packed_replay(block)
    assert type(block) is original
    assert "packed_graph_helper" not in block.__dict__
