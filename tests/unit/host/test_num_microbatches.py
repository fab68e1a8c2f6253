"""``bridge_cudagraph.host.num_microbatches``: megatron-core's graph helper sees the plan's count inside the block,
its own function after it."""

from __future__ import annotations

import pytest
from _leaving import leave

from bridge_cudagraph.host import num_microbatches


@pytest.mark.parametrize("raising", [False, True], ids=["returns", "raises"])
def test_explicit_num_microbatches_is_undone(raising):
    from megatron.core.transformer import cuda_graphs

    original = cuda_graphs.get_num_microbatches
    with num_microbatches.explicit_num_microbatches(7):
        assert cuda_graphs.get_num_microbatches() == 7
    leave(num_microbatches.explicit_num_microbatches(3), raising)
    assert cuda_graphs.get_num_microbatches is original
