"""Tight packing (:mod:`bridge_cudagraph.capture.tight`): the rows' extents, the gather and scatter indices and
``cu_seqlens`` against a brute-force reference, the autograd of the row moves, the budget a compacted micro-batch
takes, and the replay's refusal of every case it must leave on today's path."""

from __future__ import annotations

import random

import pytest
import torch
from megatron.core.packed_seq_params import PackedSeqParams

from bridge_cudagraph.capture.packed import PackedGraphSet, PackedLanguageGraphHelper
from bridge_cudagraph.capture.tight import TightRows, gather_rows, scatter_rows, tight_rows
from bridge_cudagraph.micro_batch import current_micro_batch, open_micro_batch, row_extents
from bridge_cudagraph.plan.budgets import PackedLayout


# ------------------------------------------------------------------------------------------ brute force
def brute_force(extents: list[int], width: int) -> tuple[list[int], list[int], list[int]]:
    """``(gather, cu_seqlens, scatter)`` by walking every position of every row."""
    gather, cu, scatter = [], [0], []
    for r, e in enumerate(extents):
        keep = e if e % 16 == 0 else e + (16 - e % 16)
        keep = min(keep, width)
        for c in range(width):
            if c < keep:
                gather.append(r * width + c)
        cu.append(cu[-1] + keep)
    for p in range(width * len(extents)):
        scatter.append(gather.index(p) if p in gather else len(gather))
    return gather, cu, scatter


CASES = {
    "no padding in a row": ([64, 40], 64),
    "lengths not multiples of 16": ([17, 33, 1], 48),
    "one row": ([100], 112),
    "equal rows": ([50, 50, 50], 64),
    "every row full": ([32, 32], 32),
    "width not a multiple of 16": ([7, 20], 24),
}


@pytest.mark.parametrize("extents, width", list(CASES.values()), ids=list(CASES))
def test_indices_and_boundaries_match_a_brute_force_walk(extents, width):
    rows = tight_rows(extents, width)
    gather, cu, scatter = brute_force(extents, width)
    assert rows.gather_index().tolist() == gather
    assert rows.cu_seqlens == cu and rows.tokens == cu[-1] == len(gather)
    assert rows.scatter_index().tolist() == scatter
    assert rows.full_tokens == width * len(extents)
    assert all(n % 16 == 0 or n == width for n in rows.lengths)


def test_random_rows_match_a_brute_force_walk():
    rng = random.Random(5)
    for _ in range(200):
        width = rng.choice([16, 48, 128, 200])
        extents = [rng.randint(1, width) for _ in range(rng.randint(1, 4))]
        rows = tight_rows(extents, width)
        gather, cu, scatter = brute_force(extents, width)
        assert (rows.gather_index().tolist(), rows.cu_seqlens, rows.scatter_index().tolist()) == (gather, cu, scatter)


def test_row_lengths_outside_the_rows_are_refused():
    for extents, width in (([0, 10], 16), ([17], 16), ([], 16), ([4], 0)):
        with pytest.raises(ValueError, match="do not fit"):
            tight_rows(extents, width)


def test_a_row_keeps_up_to_its_last_loss_or_visual_token():
    ids = torch.tensor([[5, 9, 9, 7, 0, 0, 0, 0], [5, 6, 7, 8, 6, 6, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]])
    loss = torch.tensor([[0, 1, 1, 0, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 1]])
    assert row_extents(loss, ids) == (3, 3, 8)
    # The visual tokens (9; 6) after the last loss token are kept: the deepstack merge needs every visual row.
    assert row_extents(loss, ids, [9, 6]) == (3, 6, 8)
    # Bridge's step hands the loss mask as one THD row [1, B x L]; a float mask as its collate makes it.
    assert row_extents(loss.reshape(1, -1).float(), ids, [9, 6]) == (3, 6, 8)
    # A row with nothing to keep keeps one token (a segment is never empty).
    assert row_extents(torch.zeros_like(loss), ids) == (1, 1, 1)
    assert row_extents(loss[:, :4], ids) is None  # shapes that do not agree: unknown, today's path


# ------------------------------------------------------------------------------------------ row moves
def test_gather_then_scatter_is_the_dense_masked_copy_forward_and_backward():
    rows = tight_rows([20, 5, 48], 48)
    gather, scatter = rows.gather_index(), rows.scatter_index()
    x = torch.randn(rows.full_tokens, 1, 8, dtype=torch.float64, requires_grad=True)
    compact = gather_rows(x, gather, scatter)
    assert torch.equal(compact, x[gather])
    w = torch.randn(rows.tokens, 1, 8, dtype=torch.float64)
    out = scatter_rows(compact * w, gather, scatter)
    keep = torch.zeros(rows.full_tokens, dtype=torch.bool)
    keep[gather] = True
    assert torch.equal(out[~keep], torch.zeros_like(out[~keep]))
    assert torch.equal(out[keep], (x[gather] * w))
    g = torch.randn_like(out)
    out.backward(g)
    # The reference: plain indexing's autograd.
    x2 = x.detach().clone().requires_grad_(True)
    ref = torch.zeros_like(x2).index_put((gather,), x2[gather] * w)
    ref.backward(g)
    assert torch.equal(x.grad, x2.grad)
    assert torch.equal(x.grad[~keep], torch.zeros_like(x.grad[~keep]))


def test_the_row_moves_are_deterministic_under_torchs_deterministic_mode():
    rows = tight_rows([30, 64], 64)
    gather, scatter = rows.gather_index(), rows.scatter_index()
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        x = torch.randn(rows.full_tokens, 1, 4, requires_grad=True)
        scatter_rows(gather_rows(x, gather, scatter) * 2, gather, scatter).sum().backward()
    finally:
        torch.use_deterministic_algorithms(previous)
    assert torch.equal(x.grad[gather], torch.full_like(x.grad[gather], 2.0))


# ------------------------------------------------------------------------------------------ budgets
def test_a_compacted_micro_batch_takes_the_smallest_budget_that_holds_its_kept_tokens():
    layout = PackedLayout(budgets=(512, 640, 800, 1024, 1280, 1600, 2048), max_sequences=2, max_seqlen=1024)
    rows = tight_rows([700, 150], 704)  # two rows padded to 704: T = 1408, T' = 704 + 160 = 864
    assert layout.budget_for(rows.full_tokens, 2) == 1600
    assert layout.budget_for(rows.tokens, 2) == 1024 < layout.budget_for(rows.full_tokens, 2)
    cu = layout.static_cu_seqlens(rows.cu_seqlens, 1024)
    assert cu[:3] == [0, 704, 864] and cu[-1] == 1024 and len(cu) == layout.cu_seqlens_length


def test_load_writes_the_compacted_boundaries_into_both_static_copies():
    layout = PackedLayout(budgets=(1024,), max_sequences=2, max_seqlen=512)
    n = layout.cu_seqlens_length
    graphs = PackedGraphSet(
        layers=[],
        rotary=torch.full((1024, 1, 1, 4), 7.0),
        cu_seqlens=torch.full((n,), -1, dtype=torch.int32),
        cu_seqlens_padded=torch.full((n,), -1, dtype=torch.int32),
    )
    full = torch.tensor([0, 512, 1024], dtype=torch.int32)  # the step's rows: two of 512
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=full, cu_seqlens_q_padded=full.clone())
    rows = tight_rows([100, 300], 512)
    graphs.load(layout, torch.ones(rows.tokens, 1, 1, 4), params, rows.tokens, cu_seqlens=rows.cu_seqlens)
    expected = layout.static_cu_seqlens([0, 112, 416], 1024)
    assert graphs.cu_seqlens.tolist() == graphs.cu_seqlens_padded.tolist() == expected
    assert bool((graphs.rotary[:416] == 1).all()) and bool((graphs.rotary[416:] == 0).all())


# ------------------------------------------------------------------------------------------ where it applies
class _Block(torch.nn.Module):
    """A decoder's attributes the replay reads (its config is a real ``TransformerConfig``)."""

    def __init__(self, **config) -> None:
        from megatron.core.transformer.transformer_config import TransformerConfig

        super().__init__()
        self.config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2, **config)
        self.pre_process = self.post_process = True


def _rows_form(rows: int, width: int) -> PackedSeqParams:
    """Bridge 0.6.2's ``_pad_and_pack_qwen3_vl_step`` metadata: one segment of the full width per row."""
    cu = torch.arange(rows + 1, dtype=torch.int32) * width
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        cu_seqlens_q_padded=cu.clone(),
        cu_seqlens_kv_padded=cu.clone(),
        max_seqlen_q=width,
        max_seqlen_kv=width,
    )


def _helper(tight: bool = True, separate_padded: bool = True) -> PackedLanguageGraphHelper:
    layout = PackedLayout(budgets=(256, 512, 1024), max_sequences=2, max_seqlen=512)
    return PackedLanguageGraphHelper([], layout=layout, tight=tight, separate_padded=separate_padded)


def _set_extents(params: PackedSeqParams, extents: tuple[int, ...]) -> None:
    """The rows' extents in the current micro-batch for ``params``, as the forward's CPU copies set them
    (:class:`~bridge_cudagraph.host.rope_index.PendingPositions`)."""
    current_micro_batch().row_extents = (params, extents)


def test_the_replay_packs_tightly_only_where_it_is_safe():
    block, params = _Block(), _rows_form(2, 512)
    hidden = torch.zeros(1024, 1, 16)
    assert _helper().tight_rows(block, hidden, params) is None  # outside a micro-batch: no extents
    with open_micro_batch() as micro_batch:
        assert _helper().tight_rows(block, hidden, params) is None  # none set
        _set_extents(params, (300, 20))
        assert micro_batch.row_extents_for(params) == (300, 20)
        rows = _helper().tight_rows(block, hidden, params)
        assert rows == TightRows(512, (304, 32))
        # Every other case: today's path (None).
        assert _helper(tight=False).tight_rows(block, hidden, params) is None
        assert _helper(separate_padded=False).tight_rows(block, hidden, params) is None
        assert _helper().tight_rows(block, hidden, None) is None
        other = _rows_form(2, 512)  # another forward's params: the extents are not its own
        assert micro_batch.row_extents_for(other) is None and _helper().tight_rows(block, hidden, other) is None
        sp = _Block(tensor_model_parallel_size=2, sequence_parallel=True)
        assert _helper().tight_rows(sp, hidden[:512], params) is None
        for stage in ("pre_process", "post_process"):  # a pipeline stage
            staged = _Block()
            setattr(staged, stage, False)
            assert _helper().tight_rows(staged, hidden, params) is None
        mtp = _Block(mtp_num_layers=1)
        assert _helper().tight_rows(mtp, hidden, params) is None
        # GPT offline packing: the real boundaries already, no separate padded copy.
        offline = PackedSeqParams(qkv_format="thd", cu_seqlens_q=params.cu_seqlens_q, max_seqlen_q=512)
        _set_extents(offline, (300, 20))
        assert _helper().tight_rows(block, hidden, offline) is None
        # Segments that are not the rows (several per row), or extents for another number of rows.
        several = _rows_form(2, 512)
        several.max_seqlen_q = 300
        _set_extents(several, (300, 20))
        assert _helper().tight_rows(block, hidden, several) is None
        _set_extents(params, (300, 20, 5))
        assert _helper().tight_rows(block, hidden, params) is None
        _set_extents(params, (300, 20))
    assert _helper().tight_rows(block, hidden, params) is None  # the micro-batch has ended


def test_the_ladder_observes_the_compacted_size_before_capture():
    block, params = _Block(), _rows_form(2, 512)
    hidden = torch.zeros(1024, 1, 16)
    helper = _helper()
    helper.observe(block, hidden, params)  # no extents: T
    assert helper.ladder.seen == 1024
    with open_micro_batch():
        _set_extents(params, (100, 60))
        helper = _helper()
        helper.observe(block, hidden, params)
        assert helper.ladder.seen == 112 + 64 and helper.ladder.first_rungs() == (256,)
        off = _helper(tight=False)
        off.observe(block, hidden, params)
        assert off.ladder.seen == 1024


def test_the_forward_copies_the_loss_mask_only_for_a_tight_packed_replay():
    """The forward derives the rows' extents (a CPU copy of the ``loss_mask`` per micro-batch) only where the
    decoder's packed replay packs rows tightly: with no replay, or one the plan left on the rows form, nothing reads
    them."""
    from types import SimpleNamespace

    from bridge_cudagraph.host.rope_index import _wants_extents

    def model(helper):
        decoder = SimpleNamespace() if helper is None else SimpleNamespace(ladder_helper=helper)
        return SimpleNamespace(language_model=SimpleNamespace(decoder=decoder))

    assert _wants_extents(model(SimpleNamespace(tight=True)))
    assert not _wants_extents(model(SimpleNamespace(tight=False)))
    assert not _wants_extents(model(None))
    assert not _wants_extents(SimpleNamespace())  # no language model at all
