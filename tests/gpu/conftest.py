"""One pure-M4 world per GPU test session (the recorder of measured numbers is in ``tests/conftest.py``)."""

from __future__ import annotations

import pytest


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
