"""The CPU parts of the ladder's MoE graphs (:mod:`bridge_cudagraph.capture.moe_layers`): the MLP half on the
micro-batch's real rows only (its outputs and gradients), every row of a padded micro-batch, the tail tokens counted
per rung, the callables' argument plumbing, and the micro-batches that fall back. The graphs themselves and
megatron-core's router and dispatcher need CUDA (the router moves its weight to the GPU when built):
``tests/gpu/test_packed_moe.py`` (packed) and ``tests/gpu/test_language_capture.py`` (padded)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from megatron.core.packed_seq_params import PackedSeqParams

from bridge_cudagraph.capture.moe_layers import (
    MoELayers,
    PackedMoEAttention,
    PaddedMoEAttention,
    packed_seq_params,
    run_on_real_rows,
)
from bridge_cudagraph.capture.stats import CaptureStats

pytestmark = pytest.mark.fast


class _RowsMixing(torch.nn.Module):
    """An MLP half whose every row depends on every row it is given (as a router's weight gradient sums over its rows
    and an expert's GEMM blocking follows its row count): its output and gradients show whether it saw a tail."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, 4))

    def _forward_mlp(self, hidden_states: torch.Tensor) -> torch.Tensor:  # the host method compat.layer_mlp calls
        return hidden_states * self.weight + hidden_states.mean(dim=0, keepdim=True)


def _moe_block(stats: CaptureStats) -> tuple[SimpleNamespace, MoELayers]:
    dense, moe = SimpleNamespace(is_moe_layer=False), _RowsMixing()
    moe.is_moe_layer = True
    moe.config = SimpleNamespace(overlap_moe_expert_parallel_comm=False)
    block = SimpleNamespace(layers=[dense, moe, dense])
    return block, MoELayers(block, [(0, 1), (1, 2), (2, 3)], stats)


@pytest.mark.parametrize(("budget", "rows"), [(12, 7), (12, 12), (12, 0)])
def test_the_mlp_half_sees_the_real_rows_only(budget, rows):
    """After an MoE layer's graph, its MLP half runs on rows ``[0, T)`` exactly as on the eager step's ``T`` rows
    (output and every gradient), and the tail rows pass around it unchanged with their own gradient."""
    stats = CaptureStats("language")
    block, moe = _moe_block(stats)
    torch.manual_seed(0)
    rung = torch.randn(budget, 1, 4, requires_grad=True)
    upstream = torch.randn(budget, 1, 4)
    out = moe.remainder(block, 2, rung, rows)
    (out * upstream).sum().backward()
    ours = (out.detach(), rung.grad.clone(), block.layers[1].weight.grad.clone())

    block.layers[1].weight.grad = None
    real = rung.detach()[:rows].clone().requires_grad_(True)
    eager = block.layers[1]._forward_mlp(real)
    (eager * upstream[:rows]).sum().backward()
    assert torch.equal(ours[0][:rows], eager.detach()) and torch.equal(ours[1][:rows], real.grad)
    assert torch.equal(ours[2], block.layers[1].weight.grad)
    assert torch.equal(ours[0][rows:], rung.detach()[rows:]) and torch.equal(ours[1][rows:], upstream[rows:])


def test_a_dense_segment_passes_its_output_on():
    block, moe = _moe_block(CaptureStats("language"))
    h = torch.randn(6, 1, 4)
    assert moe.remainder(block, 1, h, 3) is h and moe.remainder(block, 3, h, 3) is h


def test_a_padded_micro_batchs_mlp_half_runs_on_every_row():
    """Padded rows ``(S, mbs, H)`` have no tail: the replay passes ``rows = S`` and the MLP half sees the whole
    micro-batch, padding included, as Bridge's padded step routes it."""
    block, moe = _moe_block(CaptureStats("language"))
    h = torch.randn(6, 2, 4)
    assert torch.equal(moe.remainder(block, 2, h, h.size(0)), block.layers[1]._forward_mlp(h))


class _AttentionHalf(torch.nn.Module):
    """A layer whose ``_forward_attention`` records what it was called with (the host method compat.layer_attention
    calls)."""

    is_moe_layer = True

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[dict] = []

    def _forward_attention(self, **kwargs):
        self.calls.append(kwargs)
        return kwargs["hidden_states"] + 1, None


def test_each_form_wraps_an_moe_layer_as_its_attention_and_a_dense_one_whole():
    """``wrap`` gives an MoE layer the form's attention callable (padded: no ``packed_seq_params``, no mask; packed:
    the rung's ``cu_seqlens`` and ``max_seqlen``) and a dense layer the dense callable."""
    layer, dense = _AttentionHalf(), torch.nn.Identity()
    padded = MoELayers.wrap(layer, lambda m: dense, PaddedMoEAttention)
    assert isinstance(padded, PaddedMoEAttention)
    h, rotary = torch.zeros(3, 2, 4), torch.ones(3, 2, 1, 8)
    assert torch.equal(padded(h, rotary), h + 1)
    call = layer.calls[-1]
    assert call["packed_seq_params"] is None and call["attention_mask"] is None and call["rotary_pos_emb"] is rotary
    packed = MoELayers.wrap(layer, lambda m: dense, lambda m: PackedMoEAttention(m, 5))
    packed(torch.zeros(6, 1, 4), rotary, torch.tensor([0, 2, 6], dtype=torch.int32))
    params = layer.calls[-1]["packed_seq_params"]
    assert params.qkv_format == "thd" and params.max_seqlen_q == 5 and params.cu_seqlens_q.tolist() == [0, 2, 6]
    plain = SimpleNamespace(is_moe_layer=False)
    assert MoELayers.wrap(plain, lambda m: dense, PaddedMoEAttention) is dense


def test_run_on_real_rows_is_the_step_itself_without_a_tail():
    h = torch.randn(5, 1, 4)
    assert torch.equal(run_on_real_rows(lambda x: x * 2, h, 5), h * 2)


def test_the_tail_tokens_are_counted_per_rung():
    """:meth:`MoELayers.count_tail` adds the rung's tail to ``stats.moe_tail_tokens`` (the tokens the MoE layers did
    not see)."""
    stats = CaptureStats("language")
    _, moe = _moe_block(stats)
    for budget, tokens in ((64, 40), (64, 60), (128, 100)):
        moe.count_tail(budget=budget, tokens=tokens)
    assert stats.moe_tail_tokens == {64: 24 + 4, 128: 28}


def test_an_moe_layer_must_be_a_graph_of_its_own_and_without_expert_parallel_overlap():
    from bridge_cudagraph.capture.checks import CaptureError

    stats = CaptureStats("language")
    block, _ = _moe_block(stats)
    with pytest.raises(CaptureError, match="MoE layer 1 shares a graph"):
        MoELayers(block, [(0, 2), (2, 3)], stats)
    block.layers[1].config.overlap_moe_expert_parallel_comm = True
    with pytest.raises(CaptureError, match="overlap_moe_expert_parallel_comm"):
        MoELayers(block, [(0, 1), (1, 2), (2, 3)], stats)


def test_a_micro_batch_with_tokens_per_sample_falls_back():
    """megatron-core routes each sample as a row of its own when ``tokens_per_sample`` is set
    (``_maybe_unflatten_for_moe``), which a rung with a tail cannot divide: that micro-batch runs eagerly."""
    cu = torch.tensor([0, 8, 16], dtype=torch.int32)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=8, max_seqlen_kv=8)
    assert MoELayers.misfit(params) is None
    params.tokens_per_sample = 8
    cause, detail = MoELayers.misfit(params)
    assert cause == "moe-rows" and "tokens_per_sample" in detail


def test_the_graphs_packed_seq_params_name_the_static_boundaries():
    cu, padded = torch.tensor([0, 5, 16], dtype=torch.int32), torch.tensor([0, 8, 16], dtype=torch.int32)
    params = packed_seq_params(cu, padded, 12)
    assert params.qkv_format == "thd" and params.cu_seqlens_q is cu and params.cu_seqlens_kv is cu
    assert params.cu_seqlens_q_padded is padded and params.cu_seqlens_kv_padded is padded
    assert (params.max_seqlen_q, params.max_seqlen_kv) == (12, 12)
    alone = packed_seq_params(cu, None, 12)
    assert alone.cu_seqlens_q_padded is None and alone.cu_seqlens_kv_padded is None


def test_an_moe_layers_remainder_follows_its_graph_before_the_deepstack_merge():
    """The ladder's replay composes what follows a segment into the one ``after_segment`` of ``replay_segments``: the
    MoE layer's eager MLP half (handed the micro-batch's real rows) first, then the deepstack merge after that layer,
    and the merged hidden states go on into the next segment; a segment that is not an MoE layer passes its output to
    the merge unchanged. Plain callables stand in for the graphs and the remainder (both need CUDA: tests/gpu)."""
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
            return h + 1

        return run

    def remainder(got_block, end, outputs, rows):
        assert got_block is block and rows == 1
        if end != 2:  # layer 1 is the MoE layer, a segment of its own
            return outputs
        calls.append("remainder 2")
        return outputs * 10

    segments = [(0, 1), (1, 2), (2, 3)]
    ladder = SimpleNamespace(segments=[segments], decoders=[block], segment_remainder=remainder)
    graphs = [graph("0", False), graph("1", True), graph("2", False)]
    kwargs = {"deepstack_visual_embeds": [100, 200]}
    out = LanguageLadder._replay_layers(ladder, block, graphs, torch.zeros(1), (), visual=None, kwargs=kwargs, rows=1)
    assert calls == ["graph 0", "merge 100", "graph 1", "remainder 2", "merge 200", "graph 2"]
    assert out.item() == ((0 + 1 + 100) + 1) * 10 + 200 + 1
