"""The leak finder names who holds a tensor that should have been freed (CPU tensors stand in for CUDA ones)."""

from __future__ import annotations

import torch

from bridge_cudagraph.harness.leaks import holder_chains

_REGISTRY: dict[str, object] = {}  # a module-level global, as a library's registry would be


class Optimizer:
    """Stands for an object that keeps its state in a dict attribute."""

    def __init__(self) -> None:
        self.state = {"exp_avg": torch.zeros(8)}


def test_chain_names_the_dict_key_and_the_owner_class():
    optimizer = Optimizer()
    chains = holder_chains(optimizer.state["exp_avg"])
    assert any("dict['exp_avg']" in c and "Optimizer" in c for c in chains), chains
    assert all(c.startswith("Tensor(8,) torch.float32") for c in chains)


def test_chain_reaches_a_module_global():
    _REGISTRY["last"] = Optimizer()
    try:
        chains = holder_chains(_REGISTRY["last"].state["exp_avg"])
        assert any(c.endswith(f"module {__name__}") for c in chains), chains
    finally:
        _REGISTRY.clear()


def test_closure_cells_and_lists_are_named():
    held = [torch.ones(2)]

    def hook():
        return held

    chains = holder_chains(held[0])
    assert any("list[0] <- closure cell" in c for c in chains), chains
    assert hook() is held
