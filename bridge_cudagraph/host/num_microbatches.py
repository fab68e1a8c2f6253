"""The micro-batch count megatron-core's TE graph helper reads, made the plan's for the length of a capture.

Host change:
  changes: ``megatron.core.transformer.cuda_graphs.get_num_microbatches`` (:func:`explicit_num_microbatches`)
  written for: megatron-core 0.19.2
  gate: language graphs, around their capture
  undo: leaving the block
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from bridge_cudagraph.host.changes import ORIGINAL

__all__ = ["explicit_num_microbatches"]


@contextlib.contextmanager
def explicit_num_microbatches(count: int) -> Iterator[None]:
    """Make megatron-core's TE helper see ``count`` micro-batches instead of the global calculator's.

    Patches: ``megatron.core.transformer.cuda_graphs.get_num_microbatches`` (megatron-core 0.19.2), the module-level
    name ``TECudaGraphHelper._get_cuda_graph_input_data`` calls (the process-global calculator of
    ``megatron.core.num_microbatches_calculator``) for the PP schedule and for TE's warmup-iteration count, even at
    PP=1. Why: the plugin never creates that global calculator, and the count must be the plan's. Undone when the
    block is left (the capture is over).
    """
    from megatron.core.transformer import cuda_graphs

    original = cuda_graphs.get_num_microbatches

    def get_num_microbatches() -> int:
        return count

    setattr(get_num_microbatches, ORIGINAL, original)
    cuda_graphs.get_num_microbatches = get_num_microbatches
    try:
        yield
    finally:
        cuda_graphs.get_num_microbatches = original
