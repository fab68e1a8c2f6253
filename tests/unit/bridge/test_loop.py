"""The Bridge-loop GPU test's checkpoint-key reader cannot make two broken checkpoints compare equal (issue #35):
a ``common.pt`` that is missing or unreadable is a failure naming the file, not a placeholder on both sides."""

from __future__ import annotations

import importlib.util
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


@pytest.fixture
def checkpoint(tmp_path):
    """A torch_dist checkpoint folder as megatron-core writes one: sharded tensors and a ``common.pt``."""
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "iter_0000030"
    dcp.save({"decoder.weight": torch.ones(2, 2)}, storage_writer=dcp.FileSystemWriter(str(folder)), no_dist=True)
    torch.save({"iteration": 30, "args": None}, folder / "common.pt")
    return folder


def test_a_readable_checkpoint_gives_both_kinds_of_keys(checkpoint_keys, checkpoint):
    assert checkpoint_keys(checkpoint) == {"sharded": ["decoder.weight"], "common": ["args", "iteration"]}


def test_an_unreadable_common_file_fails(checkpoint_keys, checkpoint):
    (checkpoint / "common.pt").write_bytes(b"not a pickle")
    with pytest.raises(AssertionError, match=r"common\.pt is unreadable: UnpicklingError"):
        checkpoint_keys(checkpoint)


def test_a_missing_common_file_fails(checkpoint_keys, checkpoint):
    (checkpoint / "common.pt").unlink()
    with pytest.raises(AssertionError, match=r"common\.pt is missing"):
        checkpoint_keys(checkpoint)
