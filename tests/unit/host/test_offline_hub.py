"""``bridge_cudagraph.host.offline_hub``: the Hub's constants and environment inside the block, and as they were
after it, also when the block raises."""

from __future__ import annotations

import os

import pytest
from _leaving import leave

from bridge_cudagraph.host import offline_hub


@pytest.mark.parametrize("raising", [False, True], ids=["returns", "raises"])
def test_offline_hub_is_undone(tmp_path, monkeypatch, raising):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_CACHE", "/somewhere/else")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    before = (constants.HF_HUB_OFFLINE, constants.HF_HUB_CACHE)
    env = dict(os.environ)
    with offline_hub.offline_hub(tmp_path):
        assert constants.HF_HUB_OFFLINE is True and constants.HF_HUB_CACHE == str(tmp_path)
        assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["HF_HUB_CACHE"] == str(tmp_path)
    leave(offline_hub.offline_hub(tmp_path), raising)
    assert constants.HF_HUB_OFFLINE is before[0] and constants.HF_HUB_CACHE is before[1]
    assert dict(os.environ) == env
