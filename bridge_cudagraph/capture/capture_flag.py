"""megatron-core's process-wide "capturing" flag, raised around the captures this package runs itself."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["megatron_capturing"]


@contextlib.contextmanager
def megatron_capturing() -> Iterator[None]:
    """Raise megatron-core's process-wide "capturing" flag around a capture megatron-core does not run itself, as its
    own helper raises it around its capture (``_start_capturing``); lowered when the block is left, also by an
    exception.

    While the flag is up, megatron-core's DDP gradient hooks (``DistributedDataParallel._make_backward_post_hook``)
    return early, so the backward a capture records hands its parameter gradients back to autograd instead of adding
    them into ``main_grad`` inside the graph (``docs/design/param-grads.md`` says what breaks without it).
    """
    from bridge_cudagraph.host.compat import set_graph_capturing

    set_graph_capturing(True)
    try:
        yield
    finally:
        set_graph_capturing(False)
