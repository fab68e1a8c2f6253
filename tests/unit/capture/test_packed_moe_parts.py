"""The CPU parts of the packed MoE graphs (:mod:`bridge_cudagraph.capture.packed_moe`): the rung's padding mask (its
view of the copy's static buffer, its fill from a token count, the masked tokens counted per rung), the callables'
argument plumbing, and the micro-batches that fall back. The graphs themselves, megatron-core's router and dispatcher
and the eager remainder need CUDA: ``tests/gpu/test_packed_moe.py``."""

from __future__ import annotations

import pytest
import torch
from megatron.core.packed_seq_params import PackedSeqParams

from bridge_cudagraph.capture.packed_moe import MaskBlind, PackedMoE, fill_padding_mask, packed_seq_params
from bridge_cudagraph.capture.static_inputs import StaticBuffers
from bridge_cudagraph.capture.stats import CaptureStats

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(("budget", "tokens", "tp"), [(64, 40, 1), (64, 64, 1), (64, 0, 1), (128, 80, 2)])
def test_the_mask_is_true_on_the_rungs_tail_only(budget, tokens, tp):
    """``[1, B/tp]``, False on the rank's real rows ``[0, T/tp)`` (the packed replay pads each rank's rows at its end),
    True after; a second fill for a smaller micro-batch leaves nothing of the first."""
    statics = StaticBuffers("cpu")
    mask = PackedMoE.mask_view(statics, budget, tp)
    assert mask.shape == (1, budget // tp) and mask.dtype == torch.bool and not mask.any()
    fill_padding_mask(mask, budget // tp)  # a full micro-batch first
    fill_padding_mask(mask, tokens // tp)
    want = torch.arange(budget // tp) >= tokens // tp
    assert torch.equal(mask[0], want)
    assert int(mask.sum()) == (budget - tokens) // tp


def test_every_rung_of_a_copy_views_one_buffer():
    """The rungs' masks are views of the copy's one buffer, allocated at the largest rung (captured first), as the
    other static inputs are: filling a smaller rung's mask writes that buffer's first rows."""
    statics = StaticBuffers("cpu")
    large = PackedMoE.mask_view(statics, 256, 1)
    small = PackedMoE.mask_view(statics, 64, 1)
    assert small.data_ptr() == large.data_ptr() and statics.nbytes() == 256
    fill_padding_mask(small, 16)
    assert int(large[0, :64].sum()) == 48 and not large[0, 64:].any()


def test_the_masked_tokens_are_counted_per_rung():
    """:meth:`PackedMoE.load_mask` fills the mask and adds the rung's tail to ``stats.masked_tokens`` (a tightly packed
    micro-batch counts its ``T'``, the tokens the graphs see)."""
    stats = CaptureStats("language")
    decoder = torch.nn.Module()
    decoder.layers = torch.nn.ModuleList()  # the counting reads no layer; the layers' checks are the GPU test's
    moe = PackedMoE(decoder, [], stats)
    statics = StaticBuffers("cpu")
    for budget, tokens in ((64, 40), (64, 60), (128, 100)):
        mask = PackedMoE.mask_view(statics, budget, 1)
        moe.load_mask(mask, budget=budget, tokens=tokens, tp=1)
        assert int(mask.sum()) == budget - tokens
    assert stats.masked_tokens == {64: 24 + 4, 128: 28}


def test_a_micro_batch_with_tokens_per_sample_falls_back():
    """megatron-core routes each sample as a row of its own when ``tokens_per_sample`` is set
    (``_maybe_unflatten_for_moe``), which a rung with a tail cannot divide: that micro-batch runs eagerly."""
    cu = torch.tensor([0, 8, 16], dtype=torch.int32)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=8, max_seqlen_kv=8)
    assert PackedMoE.misfit(params) is None
    params.tokens_per_sample = 8
    cause, detail = PackedMoE.misfit(params)
    assert cause == "moe-rows" and "tokens_per_sample" in detail


def test_the_graphs_packed_seq_params_name_the_static_boundaries():
    cu, padded = torch.tensor([0, 5, 16], dtype=torch.int32), torch.tensor([0, 8, 16], dtype=torch.int32)
    params = packed_seq_params(cu, padded, 12)
    assert params.qkv_format == "thd" and params.cu_seqlens_q is cu and params.cu_seqlens_kv is cu
    assert params.cu_seqlens_q_padded is padded and params.cu_seqlens_kv_padded is padded
    assert (params.max_seqlen_q, params.max_seqlen_kv) == (12, 12)
    alone = packed_seq_params(cu, None, 12)
    assert alone.cu_seqlens_q_padded is None and alone.cu_seqlens_kv_padded is None


class _Arguments(torch.nn.Module):
    """A layer callable that returns what it was handed."""

    def forward(self, hidden_states, *statics):
        return (hidden_states, *statics)


def test_a_dense_layer_beside_moe_layers_does_not_see_the_mask():
    """Every graph of an MoE model's set reads the same static inputs, the mask last; a dense layer's callable hands
    its layer all but the mask."""
    h, rotary, cu, mask = torch.zeros(4, 1, 2), torch.zeros(4, 1, 1, 2), torch.zeros(3), torch.zeros(1, 4).bool()
    out = MaskBlind(_Arguments())(h, rotary, cu, mask)
    assert len(out) == 3 and all(a is b for a, b in zip(out, (h, rotary, cu), strict=True))


def test_an_moe_layers_remainder_follows_its_graph_before_the_deepstack_merge():
    """The ladder's replay composes what follows a segment into the one ``after_segment`` of ``replay_segments``: the
    MoE layer's eager remainder (on its graph's several outputs) first, then the deepstack merge after that layer, and
    the merged hidden states go on into the next segment; a segment that is not an MoE layer passes its output to the
    merge unchanged. Plain callables stand in for the graphs and the remainder (both need CUDA: tests/gpu)."""
    from types import SimpleNamespace

    from bridge_cudagraph.capture.language_ladder import LanguageLadder

    calls: list = []

    def deepstack_process(h, visual, embed):
        calls.append(f"merge {embed}")
        return h + embed

    layer = SimpleNamespace(cuda_graph_manual_hooks=[])
    block = SimpleNamespace(
        config=SimpleNamespace(sequence_parallel=False),
        layers=[layer, layer, layer],
        pre_process=True,
        _deepstack_process=deepstack_process,
    )

    def graph(name: str, moe: bool):
        def run(h, *statics):
            calls.append(f"graph {name}")
            return (h + 1, "probs", h) if moe else h + 1

        return run

    def remainder(got_block, end, outputs):
        assert got_block is block
        if end != 2:  # layer 1 is the MoE layer, a segment of its own
            return outputs
        calls.append("remainder 2")
        assert outputs[1] == "probs"
        return outputs[0] * 10

    segments = [(0, 1), (1, 2), (2, 3)]
    ladder = SimpleNamespace(segments=[segments], decoders=[block], segment_remainder=remainder)
    graphs = [graph("0", False), graph("1", True), graph("2", False)]
    kwargs = {"deepstack_visual_embeds": [100, 200]}
    out = LanguageLadder._replay_layers(ladder, block, graphs, torch.zeros(1), (), visual=None, kwargs=kwargs)
    assert calls == ["graph 0", "merge 100", "graph 1", "remainder 2", "merge 200", "graph 2"]
    assert out.item() == ((0 + 1 + 100) + 1) * 10 + 200 + 1
