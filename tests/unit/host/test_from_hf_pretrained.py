"""``bridge_cudagraph.host.from_hf_pretrained``: the hook runs ahead of Bridge's loading inside the block, and the
class gets its very classmethod back after it."""

from __future__ import annotations

import pytest
from _leaving import Boom, leave

from bridge_cudagraph.host import from_hf_pretrained


@pytest.mark.parametrize("raising", [False, True], ids=["returns", "raises"])
def test_from_hf_pretrained_hook_is_undone(raising):
    from megatron.bridge.models.conversion.auto_bridge import AutoBridge

    original = AutoBridge.__dict__["from_hf_pretrained"]
    seen = []

    def refuse(path, kwargs):
        seen.append((path, kwargs))
        raise Boom  # before Bridge's own code, so nothing reaches the Hub

    with from_hf_pretrained.from_hf_pretrained_hook(refuse):
        assert AutoBridge.__dict__["from_hf_pretrained"] is not original
        with pytest.raises(Boom):
            AutoBridge.from_hf_pretrained("Org/Model", revision="abc")
    assert seen == [("Org/Model", {"revision": "abc"})]
    leave(from_hf_pretrained.from_hf_pretrained_hook(refuse), raising)
    assert AutoBridge.__dict__["from_hf_pretrained"] is original
