"""host.replica_sync: the vision replicas' gradient average after megatron-core's finalisation, put on and taken off.

A real two-rank gloo world (language TP 2, vision TP 1: every rank holds a replica of the encoder), a real
megatron-core ``TransformerConfig`` as the model config that carries ``finalize_model_grads_func``, and the plugin's
own replica group.
"""

from __future__ import annotations

import functools

import pytest
from _dist import run_world


class Encoder:
    """Stands for the rebuilt encoder in the chunks' module walk: its collection and its parameters."""

    def __init__(self, pg_collection, module) -> None:
        self.pg_collection = pg_collection
        self.module = module

    def parameters(self):
        return self.module.parameters()


def _finalize(calls, *args, **kwargs):
    calls.append(args)
    return "finalized"


def _sync_world(rank: int, world: int) -> dict:
    import torch

    from bridge_cudagraph.host import replica_sync
    from bridge_cudagraph.parallel.groups import build_collections
    from bridge_cudagraph.parallel.layout import ParallelLayout, VisionLayout

    collections = build_collections(ParallelLayout(tp=2), VisionLayout(tp=1), backend="gloo")
    module = torch.nn.Linear(2, 2)
    for p in module.parameters():
        p.main_grad = torch.full_like(p, float(rank))
    encoder = Encoder(collections["vision"], module)

    class Chunk:
        def modules(self):
            return [self, encoder]

    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2)
    calls: list = []
    original = functools.partial(_finalize, calls)
    config.finalize_model_grads_func = original
    # The wrapper finds the encoder by its type in the chunks' module walk: here the stand-in's.
    installed = replica_sync.install_grad_sync(config, [Chunk()], Encoder)
    again = replica_sync.install_grad_sync(config, [Chunk()], Encoder)
    wrapper = config.finalize_model_grads_func
    result = config.finalize_model_grads_func("chunks")
    before_undo = replica_sync.grad_sync_installed(config)
    undone = replica_sync.uninstall_grad_sync(config)
    return {
        "installed": installed,
        "again": again,
        "wrapped": wrapper is not original,
        "result": result,
        "calls": len(calls),
        "grad": module.weight.main_grad.clone(),
        "before_undo": before_undo,
        "undone": undone,
        "restored": config.finalize_model_grads_func is original,
        "after_undo": replica_sync.grad_sync_installed(config),
        "undo_again": replica_sync.uninstall_grad_sync(config),
    }


@pytest.mark.slow
def test_the_average_is_put_on_once_runs_after_the_host_and_comes_off():
    results = run_world(2, _sync_world)
    for r in results:
        assert r["installed"] and r["again"] and r["wrapped"]
        assert r["result"] == "finalized" and r["calls"] == 1  # the host's function ran once, its result kept
        assert r["grad"].eq(0.5).all()  # the mean of ranks 0 and 1
        assert r["before_undo"] and r["undone"] and r["restored"]  # the very function that was there
        assert not r["after_undo"] and not r["undo_again"]


def test_a_wrapper_put_on_top_is_not_taken_off():
    """Taking ours out from under another wrapper would drop that one too: the undo leaves the chain as it is."""
    from bridge_cudagraph.host import replica_sync

    holder = type("Holder", (), {})()
    ours = functools.partial(_finalize, [])
    setattr(ours, replica_sync.WRAPPED, _finalize)  # as if installed; no owner mark, as on a wrapper on top

    @functools.wraps(ours)
    def on_top(*args, **kwargs):
        return ours(*args, **kwargs)

    holder.finalize_model_grads_func = on_top
    assert replica_sync.grad_sync_installed(holder)
    assert not replica_sync.uninstall_grad_sync(holder) and holder.finalize_model_grads_func is on_top
