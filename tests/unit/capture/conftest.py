"""Stand-ins shared by the capture tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def fake_allocator(monkeypatch) -> dict[str, int]:
    """The allocator calls the ladder makes, on a machine without CUDA: a capture stand-in grows ``reserved`` and
    ``allocated`` in the returned dict (a measurement stand-in; the GPU tests measure the real pools)."""
    state = {"reserved": 0, "allocated": 0}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a, **k: state["reserved"])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a, **k: state["allocated"])
    return state
