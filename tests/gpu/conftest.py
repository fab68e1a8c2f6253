"""One pure-M4 world per GPU test session, and a recorder for the numbers the tests measure."""

from __future__ import annotations

import json
import os
import platform
import time

import pytest

_RECORDS: list[dict] = []


@pytest.fixture(scope="session")
def world():
    """NCCL world of one GPU with our collections; ``parallel_state`` stays uninitialised."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from bridge_cudagraph.harness.world import close_world, init_world
    from bridge_cudagraph.layout import VisionLayout

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

    from bridge_cudagraph.compat import installed_version

    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "megatron_core": installed_version("megatron-core"),
        "megatron_bridge": installed_version("megatron-bridge"),
        "transformer_engine": installed_version("transformer-engine"),
        "python": platform.python_version(),
        "command": os.environ.get("BRIDGE_CUDAGRAPH_COMMAND", "pytest -m gpu"),
        "exitstatus": int(exitstatus),
    }
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": _RECORDS}, f, indent=2, default=str)
