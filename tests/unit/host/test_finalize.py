"""finalize_host: megatron-core's ``reset_model_temporary_tensors`` on the listed modules is its walk, minus the walk.

Real megatron-core 0.19.2 pieces on the CPU: its ``TransformerConfig`` and its ``reset_model_temporary_tensors``,
reached as ``finalize_model_grads`` reaches it (the module-level name, looked up at call time). The model is a small
``torch.nn`` tree with two router-like modules holding the attributes the host tests (``expert_bias`` with its
``local_tokens_per_expert``, ``qb_beta_accum``/``qb_beta_count``); the GPU path is ``tests/gpu/test_bridge_loop.py``'s.
"""

from __future__ import annotations

import pytest
import torch
from _leaving import leave

from bridge_cudagraph.host import finalize as finalize_host
from bridge_cudagraph.host.changes import ORIGINAL


class Router(torch.nn.Module):
    def __init__(self, quantile: bool) -> None:
        super().__init__()
        self.register_buffer("expert_bias", torch.zeros(4))
        self.register_buffer("local_tokens_per_expert", torch.arange(4.0) + 1)
        self.qb_beta_accum = torch.full((4,), 3.0) if quantile else None
        self.qb_beta_count = torch.tensor(5) if quantile else None


class Chunk(torch.nn.Module):
    """Counts its ``modules()`` walks (what the listing saves)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(
            [torch.nn.Sequential(torch.nn.Linear(2, 2), Router(quantile=i == 1)) for i in range(3)]
        )
        self.walks = 0

    def modules(self):
        self.walks += 1
        return super().modules()


def _config():
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        num_layers=1,
        hidden_size=8,
        num_attention_heads=2,
        num_moe_experts=4,
        moe_router_enable_expert_bias=True,
        moe_router_score_function="sigmoid",
    )


def _host():
    import importlib

    return importlib.import_module("megatron.core.distributed.finalize_model_grads")


def _finalize(model, *args, **kwargs):
    """The end of megatron-core's finalize_model_grads: its reset, by the module-level name."""
    _host().reset_model_temporary_tensors(kwargs.pop("config"), model)


def _state(chunks):
    return [
        (m.local_tokens_per_expert.clone(), None if m.qb_beta_accum is None else m.qb_beta_accum.clone())
        for c in chunks
        for m in c.modules()
        if isinstance(m, Router)
    ]


def test_listed_reset_is_the_hosts_walk_without_the_walk():
    config = _config()
    ours, theirs = [Chunk()], [Chunk()]
    holder = type("Holder", (), {})()
    holder.finalize_model_grads_func = _finalize
    assert finalize_host.install(holder, ours)
    assert finalize_host.installed(holder) and holder.finalize_model_grads_func is not _finalize
    assert finalize_host.install(holder, ours)  # idempotent: not wrapped twice
    assert getattr(holder.finalize_model_grads_func, finalize_host.WRAPPED) is _finalize
    walks = ours[0].walks
    for _ in range(3):
        holder.finalize_model_grads_func(ours, config=config)
        _finalize(theirs, config=config)
    assert ours[0].walks == walks, "the listed reset walked the chunk"
    assert theirs[0].walks == 3, "another model's reset must walk as the host's does"
    got, want = _state(ours), _state(theirs)
    assert len(got) == len(want) == 3
    for (a, qa), (b, qb) in zip(got, want, strict=True):
        assert torch.equal(a, b) and torch.equal(a, torch.zeros(4))
        assert (qa is None and qb is None) or (torch.equal(qa, qb) and torch.equal(qa, torch.zeros(4)))
    assert not hasattr(_host().reset_model_temporary_tensors, "_bridge_cudagraph_original"), "left patched"
    assert finalize_host.uninstall(holder) and holder.finalize_model_grads_func is _finalize
    assert not finalize_host.installed(holder) and not finalize_host.uninstall(holder)


def test_listing_keeps_only_what_the_host_could_reset():
    chunk = Chunk()
    (listed,) = finalize_host.listed_modules([chunk])
    assert [type(m) for m in listed] == [Router, Router, Router]


def test_a_wrapper_put_on_top_is_not_taken_off():
    import functools

    holder = type("Holder", (), {})()
    holder.finalize_model_grads_func = _finalize
    assert finalize_host.install(holder, [Chunk()])
    ours = holder.finalize_model_grads_func

    @functools.wraps(ours)
    def on_top(*args, **kwargs):  # as replicas.install_grad_sync wraps
        return ours(*args, **kwargs)

    holder.finalize_model_grads_func = on_top
    assert finalize_host.installed(holder) and finalize_host.install(holder, [Chunk()])
    assert not finalize_host.uninstall(holder) and holder.finalize_model_grads_func is on_top


def test_nothing_to_wrap_before_the_function_is_set():
    holder = type("Holder", (), {"finalize_model_grads_func": None})()
    assert not finalize_host.install(holder, [Chunk()]) and holder.finalize_model_grads_func is None


@pytest.mark.parametrize("raising", [False, True], ids=["returns", "raises"])
def test_listed_reset_modules_is_undone(raising):
    import importlib

    host = importlib.import_module("megatron.core.distributed.finalize_model_grads")
    original = host.reset_model_temporary_tensors
    with finalize_host.listed_reset_modules([object()], [[]]):
        assert getattr(host.reset_model_temporary_tensors, ORIGINAL) is original
    leave(finalize_host.listed_reset_modules([object()], [[]]), raising)
    assert host.reset_model_temporary_tensors is original
