"""Markers: ``gpu`` tests need a CUDA device and are skipped with a reason elsewhere (CI has none)."""

from __future__ import annotations

import pytest


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
