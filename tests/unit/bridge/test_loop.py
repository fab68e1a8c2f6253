"""The Bridge-loop GPU test's checkpoint-key reader cannot make two broken checkpoints compare equal (issue #35): a
common state that is missing or unreadable is a failure naming the folder, not a placeholder on both sides.

The checkpoints are laid out as megatron-core 0.19 writes a torch_dist one, with its own pieces: the sharded tensors
and the common state (a ``ShardedObject`` under its ``unique_key``, pickled as a list the torch strategy writes) in
torch's distributed-checkpoint files, and ``metadata.json`` (``save_config``). megatron-core's own ``save`` needs a
GPU even for CPU tensors, so the files are written by the calls it makes."""

from __future__ import annotations

import importlib.util
import io
import sys
from pathlib import Path

import pytest
import torch

GPU_TEST = Path(__file__).resolve().parents[2] / "gpu" / "test_bridge_loop.py"


@pytest.fixture(scope="module")
def checkpoint_keys():
    name = "bridge_loop_gpu_test"
    spec = importlib.util.spec_from_file_location(name, GPU_TEST)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module._checkpoint_keys
    finally:
        sys.modules.pop(name, None)


def _write(folder: Path, common: dict | None) -> Path:
    import torch.distributed.checkpoint as dcp
    from megatron.core.dist_checkpointing.core import CheckpointingConfig, save_config
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    state: dict = {"decoder.weight": torch.ones(2, 2)}
    if common is not None:
        pickled = io.BytesIO()
        torch.save([common], pickled)  # strategies/torch.py: the data of the key's shards, as a list
        state[ShardedObject("common_state", None, (1,), (0,)).unique_key] = pickled
    folder.mkdir(parents=True)
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(folder)), no_dist=True)
    save_config(CheckpointingConfig("torch_dist", 1), str(folder))
    return folder


@pytest.fixture
def checkpoint(tmp_path):
    return _write(tmp_path / "iter_0000030", {"iteration": 30, "args": None})


def test_a_readable_checkpoint_gives_both_kinds_of_keys(checkpoint_keys, checkpoint):
    keys = checkpoint_keys(checkpoint)
    assert keys["common"] == ["args", "iteration"]
    assert "decoder.weight" in keys["sharded"], keys


def test_a_legacy_common_file_is_read_and_an_unreadable_one_fails(checkpoint_keys, checkpoint):
    torch.save({"iteration": 30, "rng_state": None}, checkpoint / "common.pt")  # megatron-core reads it first
    assert checkpoint_keys(checkpoint)["common"] == ["iteration", "rng_state"]
    (checkpoint / "common.pt").write_bytes(b"not a pickle")
    with pytest.raises(AssertionError, match=r"iter_0000030: common state unreadable: UnpicklingError"):
        checkpoint_keys(checkpoint)


def test_a_checkpoint_without_its_common_state_fails(checkpoint_keys, tmp_path):
    folder = _write(tmp_path / "iter_0000030", None)
    with pytest.raises(AssertionError, match=r"iter_0000030: common state unreadable"):
        checkpoint_keys(folder)


def test_a_folder_that_is_no_distributed_checkpoint_fails(checkpoint_keys, checkpoint):
    (checkpoint / "metadata.json").unlink()
    with pytest.raises(AssertionError, match=r"common state unreadable: CheckpointingException"):
        checkpoint_keys(checkpoint)
