"""The leak finder names who holds a tensor that should have been freed (CPU tensors stand in for CUDA ones)."""

from __future__ import annotations

import torch

from benchmarks.leaks import holder_chains

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


class _Buffer:
    """Megatron's ``_ParamAndGradBuffer`` keeps the contiguous parameter and gradient storage in these fields."""

    def __init__(self, n: int) -> None:
        self.param_data = torch.zeros(n)
        self.grad_data = torch.zeros(n)


class _MegatronOptimizer:
    """Megatron's optimizers wrap the torch optimizer that holds the main parameters and the Adam states."""

    def __init__(self, params) -> None:
        self.optimizer = torch.optim.Adam(params)


def test_training_tensors_are_the_buffers_main_params_and_adam_states():
    from benchmarks.leaks import release_training_memory, training_tensors

    chunk = torch.nn.Linear(2, 2)  # a plain module: its ``buffers`` is nn.Module's method, not a list
    ddp_chunk = torch.nn.Module()
    ddp_chunk.buffers = [_Buffer(6)]
    main = torch.nn.Parameter(torch.ones(3))
    optimizer = _MegatronOptimizer([main])
    main.grad = torch.ones(3)
    optimizer.optimizer.step()  # creates exp_avg, exp_avg_sq (and step)
    found = training_tensors([chunk, ddp_chunk], optimizer)
    ids = {id(t) for t in found}
    assert {id(ddp_chunk.buffers[0].param_data), id(ddp_chunk.buffers[0].grad_data), id(main)} <= ids
    state = optimizer.optimizer.state[main]
    assert {id(state["exp_avg"]), id(state["exp_avg_sq"])} <= ids
    assert not any(t is chunk.weight for t in found)  # only a DDP chunk's buffers, never a plain module's weights
    assert release_training_memory([chunk, ddp_chunk], optimizer) == 0  # CPU storages are left alone


def test_chained_optimizers_are_walked():
    from benchmarks.leaks import training_tensors

    a, b = torch.nn.Parameter(torch.ones(1)), torch.nn.Parameter(torch.ones(2))

    class Chained:
        chained_optimizers = [_MegatronOptimizer([a]), _MegatronOptimizer([b])]

    assert {id(t) for t in training_tensors(None, Chained())} == {id(a), id(b)}


def test_a_frame_kept_by_a_traceback_is_named():
    def fails():
        local = torch.zeros(3)  # noqa: F841 (kept alive by the frame)
        raise RuntimeError("kept")

    try:
        fails()
    except RuntimeError as error:
        kept = error
    frame = kept.__traceback__.tb_next.tb_frame
    chains = holder_chains(frame.f_locals["local"])
    assert any("frame of test_a_frame_kept_by_a_traceback_is_named.<locals>.fails" in c for c in chains), chains
    assert any("traceback" in c for c in chains), chains
