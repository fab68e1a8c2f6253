"""What a failed capture leaves: a first capture gives the model back to eager training as if graphs had never been
asked for; a later one (a ladder growing) keeps the graphs it has."""

from __future__ import annotations

import contextlib
import logging

import torch

from bridge_cudagraph.capture.grad_buffers import zero_grad_buffers

logger = logging.getLogger("bridge_cudagraph")

__all__ = ["abandon_capture", "abandon_growth"]


def abandon_capture(layers, model_chunks, error: BaseException, submodule: str) -> str:
    """Leave the model training eagerly after a failed capture, as if graphs had never been asked for.

    Clears the global "capturing" flag megatron-core set, drops any half-made graphs from the layers,
    and zeroes the gradient buffers the warmup iterations wrote into.
    """
    from bridge_cudagraph.host.compat import set_graph_capturing

    set_graph_capturing(False)
    for layer in layers:
        for graph in getattr(layer, "cuda_graphs", []) or []:
            reset = getattr(graph, "reset", None)
            if reset is not None:
                with contextlib.suppress(Exception):
                    reset()
        layer.cuda_graphs = []
        layer.cuda_graph_manual_hooks = []
    zero_grad_buffers(model_chunks)
    with contextlib.suppress(Exception):
        torch.cuda.synchronize()
    cause = f"{type(error).__name__}: {error}".splitlines()[0][:500]
    logger.warning("bridge_cudagraph: %s capture failed, training on eagerly. Cause: %s", submodule, cause)
    return cause


def abandon_growth(model_chunks, error: BaseException, submodule: str) -> None:
    """Leave the graphs a ladder already has after a failed capture of more rungs: the micro-batches that asked for
    them go on running eagerly.

    Clears the global "capturing" flag and zeroes the gradient buffers the warmup iterations wrote into, as
    :func:`abandon_capture` does, but leaves every layer's graphs as they are.
    """
    from bridge_cudagraph.host.compat import set_graph_capturing

    set_graph_capturing(False)
    zero_grad_buffers(model_chunks)
    cause = f"{type(error).__name__}: {error}".splitlines()[0][:500]
    logger.warning("bridge_cudagraph: capturing more %s budgets failed; they run eagerly: %s", submodule, cause)
