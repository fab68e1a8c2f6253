"""``bridge_cudagraph.host.training_loop``: the loop's wrapper is in effect inside its block and undone after it,
also when the block raises."""

from __future__ import annotations

import importlib
import importlib.util
import types

import pytest
from _leaving import leave

from bridge_cudagraph.host import training_loop
from bridge_cudagraph.host.changes import ORIGINAL


@pytest.mark.parametrize("raising", [False, True], ids=["returns", "raises"])
def test_training_loop_wrapper_is_undone(raising):
    def loop():
        return "trained"

    module = types.ModuleType("pretrain_like")
    module.train = loop
    released = []
    owner = types.SimpleNamespace(release_graphs=lambda reason: released.append(reason))
    with training_loop.release_graphs_if_training_raises(owner, module):
        assert module.train is not loop and getattr(module.train, ORIGINAL) is loop
        assert module.train() == "trained" and released == []
    assert module.train is loop
    leave(training_loop.release_graphs_if_training_raises(owner, module), raising)
    assert module.train is loop


@pytest.mark.skipif(
    importlib.util.find_spec("nvidia_resiliency_ext") is None,
    reason="megatron.bridge.training.pretrain imports nvidia_resiliency_ext, which only the GPU machine has",
)
def test_training_loop_wrapper_is_undone_on_bridges_own_module():
    pretrain = importlib.import_module("megatron.bridge.training.pretrain")
    real = pretrain.train
    with training_loop.release_graphs_if_training_raises(types.SimpleNamespace(release_graphs=lambda reason: None)):
        assert pretrain.train is not real
    assert pretrain.train is real
