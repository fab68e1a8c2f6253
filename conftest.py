"""Shared by ``tests/`` and ``benchmarks/tests/`` (hence at the repository root).

Markers: ``gpu`` tests need a CUDA device and are skipped with a reason elsewhere (CI has none).

And a recorder: ``record(**row)`` keeps a row under the test's name; with ``BRIDGE_CUDAGRAPH_RESULTS`` set to a JSON
path, the rows are written there at the end with the date, versions, command and the environment settings that change
what runs (``NVTE_*``, ``NCCL_*``, ``BRIDGE_CUDAGRAPH_*``, ...: pytest's own arguments alone lost them in runs 14-25).

And ``world``: one pure-M4 world per GPU test session, shared by the GPU tests and the benchmark's short run (one
NCCL world per process: two session fixtures would each try to start one).
"""

from __future__ import annotations

import json
import os
import platform
import time

import pytest

_RECORDS: list[dict] = []
#: Environment variables a record keeps (their names start so): the settings that change what a run computes.
_RECORDED_ENV = ("NVTE_", "NCCL_", "BRIDGE_CUDAGRAPH_", "PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(
        reason="needs a CUDA GPU: run `pytest -m gpu` on a GPU machine (results of the H200 runs are in results/)"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def world():
    """NCCL world of one GPU with our collections; ``parallel_state`` stays uninitialised."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from bridge_cudagraph.parallel.layout import VisionLayout
    from bridge_cudagraph.testing.world import close_world, init_world

    world = init_world(vision=VisionLayout())
    yield world
    import gc

    gc.collect()  # graphs still referenced by finished tests' models go first (their pools hold NCCL buffers)
    close_world(world)


@pytest.fixture
def record(request):
    """``record(**numbers)`` stores a row under the test's name; written to $BRIDGE_CUDAGRAPH_RESULTS at the end."""

    def _record(**row):
        _RECORDS.append({"test": request.node.name, **row})

    return _record


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("BRIDGE_CUDAGRAPH_RESULTS")
    if not path or not _RECORDS:
        return
    import torch

    from bridge_cudagraph.host.compat import installed_version

    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "megatron_core": installed_version("megatron-core"),
        "megatron_bridge": installed_version("megatron-bridge"),
        "transformer_engine": installed_version("transformer-engine"),
        "python": platform.python_version(),
        "command": os.environ.get(
            "BRIDGE_CUDAGRAPH_COMMAND", " ".join(["pytest", *map(str, session.config.invocation_params.args)])
        ),
        "environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith(_RECORDED_ENV)},
        "exitstatus": int(exitstatus),
    }
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": _RECORDS}, f, indent=2, default=str)
