"""A budget ladder's parameter gradients summed into ``main_grad`` by one small graph per backward replay.

The changes of the host this makes (TE's clone flags, megatron-core's ready mark on the parameters) are in
:mod:`bridge_cudagraph.host.graph_grads`, with their gates and undo.

Why: a backward replay of a TE graph hands autograd one gradient per parameter of its layers (200 for a run of 25
language layers at the 2B shape). For each, TE 2.20 first clones the graph's buffer (every capture keeps the clone:
:func:`~bridge_cudagraph.capture.ladder_capture.capture_budget_ladder` says why), then autograd's ``AccumulateGrad``
sets it as ``param.grad``, then megatron-core's DDP hook adds it to ``main_grad`` in Python and drops it: per parameter
and micro-batch, two allocations' worth of kernels and launches and a Python call, 1,082 of them per step on the 2B
Qwen3-VL packed step, where a profile put 30 ms of the GPU's idle time under ``AccumulateGrad``. The additions are the
only part with a result.

So each graphed callable gets one more CUDA graph, captured right after its ladder: ``main_grad.add_(grad)`` for each
of its parameters whose gradient TE does not already sum itself (TE's fused weights), reading the very buffers the
backward graph writes. A post-hook on each replay's backward node replays it and hands autograd None for those
parameters, whose ``AccumulateGrad`` then does nothing and whose DDP hook finds no gradient to add (it still tells
DDP the gradient is ready, as megatron-core's own graphs do through ``_cudagraph_wgrad_ready_event``, which lets a
``None`` gradient pass its ``overlap_grad_reduce`` check). TE's clones are switched off for them: nobody receives the
buffers any more.

The same ``add_`` on the same operands in the same order per parameter: the same ``main_grad``, bit for bit. Safe
because the summing graph runs on the backward's stream right after it (the post-hook runs before the autograd engine
moves on to any other node), so before any other replay of the pool can write the buffers, which TE may have given
back to the pool (:func:`~bridge_cudagraph.capture.ladder_capture.capture_budget_ladder`). DDP's own hook would not be
safe there: it runs on the stream DDP was built on, unordered with the compute stream's next replays. So the clones are
switched off only for the callables wrapped here, whose every backward goes through the post-hook.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from bridge_cudagraph.host import compat
from bridge_cudagraph.host.graph_grads import mark_wgrad_ready, stop_cloning, unmark_wgrad_ready

__all__ = ["SummedGraph", "ddp_consumes_param_grads", "sum_param_grads", "summed_replays"]

logger = logging.getLogger("bridge_cudagraph")


def ddp_consumes_param_grads(model_chunks, modules) -> bool:
    """Whether every trainable parameter of ``modules`` is owned by a megatron-core DDP chunk of ``model_chunks``.

    Such a parameter's gradient reaches ``main_grad`` through DDP's hook on its ``AccumulateGrad`` node, which a
    summing graph can stand in for (the hook then finds ``None`` and only marks the gradient ready). The hook itself
    is no safe reader of a graph's buffer: it runs on the stream DDP was built on, which the compute stream's next
    replays do not wait for.
    """
    from megatron.core.distributed import DistributedDataParallel

    owned: set[int] = set()
    for chunk in model_chunks:
        if not isinstance(chunk, DistributedDataParallel):
            return False
        owned.update(id(p) for p in getattr(chunk, "param_to_bucket_group", {}))
    return all(id(p) in owned for module in modules for p in module.parameters() if p.requires_grad)


class SummedGraph:
    """A TE graphed callable whose backward replays also sum its parameters' gradients into ``main_grad`` in one
    graph launch; called as the callable is. ``reset()`` undoes the change and releases TE's graphs."""

    def __init__(self, graphed: Any, state: tuple, fused: set[int], event: torch.cuda.Event, pool: Any) -> None:
        params, grads_cell, slots_cell = state
        static = grads_cell.cell_contents
        first = len(static) - len(params)
        self.graphed = graphed
        self._event = event
        pairs = [
            (param.main_grad, grad)
            for param, grad in zip(params, static[first:], strict=True)
            if grad is not None and id(param) not in fused
        ]
        #: Parameters whose gradient the summing graph adds; TE's fused weights are summed by TE inside the graph.
        self.summed = len(pairs)
        self._handled = tuple(grad is not None for grad in static[first:])
        self._none_tail = (None,) * len(self._handled)
        self.graph: torch.cuda.CUDAGraph | None = None
        if pairs:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=pool):
                for main_grad, grad in pairs:
                    main_grad.add_(grad)
        self._params = [p for p, handled in zip(params, self._handled, strict=True) if handled]
        self._restore_cloning = stop_cloning(slots_cell, first, self._handled)
        mark_wgrad_ready(self._params, event)
        self.replays = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.graphed(*args, **kwargs)
        node = getattr(out, "grad_fn", None)
        if node is not None:
            node.register_hook(self._after_backward)
        return out

    def _after_backward(self, grad_inputs: tuple, grad_outputs: tuple) -> tuple:
        """Node post-hook: sum this replay's parameter gradients, hand autograd None for them."""
        del grad_outputs
        if self.graph is not None:
            self.graph.replay()
            self._event.record()
        self.replays += 1
        # Every parameter slot is None now: a handled one by this hook, any other because TE has no buffer for it.
        return grad_inputs[: len(grad_inputs) - len(self._none_tail)] + self._none_tail

    def reset(self) -> None:
        """TE's clone flags and the parameters' mark back, then TE's own ``reset()``."""
        self._restore_cloning()
        unmark_wgrad_ready(self._params, self._event)
        if self.graph is not None:
            self.graph.reset()
        reset = getattr(self.graphed, "reset", None)
        if reset is not None:
            reset()


def sum_param_grads(graph_sets: Sequence[Any], layers: Sequence[torch.nn.Module], model_chunks, fused) -> int:
    """Put a :class:`SummedGraph` in place of every graphed callable of ``graph_sets`` (one copy's rungs, each with a
    ``layers`` list of TE graphed callables) where the gate holds; ``fused``: the parameters
    whose weight gradient TE sums into ``main_grad`` itself (:func:`~bridge_cudagraph.capture.grad_buffers.
    fused_grad_params`). Returns how many parameter gradients one rung's graphs sum (0 where the gate does not hold:
    TE's callables stay as they are)."""
    if not graph_sets or not ddp_consumes_param_grads(model_chunks, layers):
        return 0
    if any(getattr(p, "zero_out_wgrad", False) for layer in layers for p in layer.parameters()):
        return 0
    states = [[compat.te_graphed_backward_state(g) for g in graph_set.layers] for graph_set in graph_sets]
    if any(state is None for per_set in states for state in per_set):
        logger.info(
            "bridge_cudagraph: TE's graphed callables are not laid out as in the proven release; parameter "
            "gradients go through autograd and DDP's hooks"
        )
        return 0
    # A pool of their own: they allocate nothing, and were anything allocated, it must not be carved out of the
    # ladder's pool, whose free blocks hold what a replay of another graph still reads (its saved activations).
    pool = torch.cuda.graph_pool_handle()
    event = torch.cuda.Event()
    fused_ids = {id(p) for p in fused}
    for graph_set, per_set in zip(graph_sets, states, strict=True):
        for i, state in enumerate(per_set):
            assert state is not None  # every state was checked above
            graph_set.layers[i] = SummedGraph(graph_set.layers[i], state, fused_ids, event, pool)
    return sum(graph.summed for graph in graph_sets[0].layers)


def summed_replays(graphs: dict) -> int:
    """How many backward replays of ``{budget: [graph set per copy]}`` summed their parameter gradients in graphs."""
    return sum(
        graph.replays
        for sets in graphs.values()
        for graph_set in sets
        for graph in graph_set.layers
        if isinstance(graph, SummedGraph)
    )
