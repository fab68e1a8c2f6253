"""``bridge_cudagraph.host.cpu_device_properties``: a stand-in without CUDA inside the block, torch's own function
after it."""

from __future__ import annotations

import pytest
import torch
from _leaving import leave

from bridge_cudagraph.host import cpu_device_properties


@pytest.mark.parametrize("raising", [False, True], ids=["returns", "raises"])
def test_cpu_device_properties_are_undone(raising):
    original = torch.cuda.get_device_properties
    with cpu_device_properties.cpu_device_properties():
        if torch.cuda.is_available():
            assert torch.cuda.get_device_properties is original  # nothing to stand in for
        else:
            assert torch.cuda.get_device_properties is not original
            assert torch.cuda.get_device_properties(0).total_memory == 0
    leave(cpu_device_properties.cpu_device_properties(), raising)
    assert torch.cuda.get_device_properties is original
