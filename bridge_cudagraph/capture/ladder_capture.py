"""One capture of a ladder's rungs: each rung of each graph copy into that copy's pool, largest first, measured per
rung, with TE's arguments under which the rungs of a pool share its memory."""

from __future__ import annotations

import gc
from collections.abc import Sequence

import torch

from bridge_cudagraph.capture.capture_flag import megatron_capturing
from bridge_cudagraph.capture.device_memory import held_reserved, measure
from bridge_cudagraph.capture.failure import abandon_capture, abandon_growth
from bridge_cudagraph.capture.grad_buffers import fused_grad_params, zero_grad_buffers
from bridge_cudagraph.capture.param_grads import sum_param_grads
from bridge_cudagraph.capture.stats import CaptureStats

__all__ = ["capture_budget_ladder", "ladder_order_kwargs"]


def ladder_order_kwargs(callables: int) -> dict:
    """``make_graphed_callables`` arguments under which one capture of ``callables`` chained graphs (a rung) gives
    back to its pool, once its backward is captured, the memory of everything no later replay of that rung reads:
    the forward's static outputs and the consumed gradient buffers (TE's ``_order`` path with
    ``_reuse_graph_input_output_buffers``, one model chunk, one micro-batch: forward, then backward). The next rung
    captured into the pool is carved out of it, so a ladder costs about one rung of memory
    (``docs/design/shared-pool.md`` has the safety argument). Empty where TE lacks the path
    (:func:`bridge_cudagraph.host.compat.te_graphs_share_ladder_buffers`): each rung then keeps its own."""
    from bridge_cudagraph.host.compat import te_graphs_share_ladder_buffers

    if not te_graphs_share_ladder_buffers():
        return {}
    return {"_order": [1, -1], "_num_layers_per_chunk": [callables], "_reuse_graph_input_output_buffers": True}


def capture_budget_ladder(
    *,
    stats: CaptureStats,
    model_chunks,
    layers,
    budgets,
    pools: Sequence,
    capture_one,
    on_capture_error: str,
    submodule: str,
    first: bool = True,
    sum_grads: bool = True,
) -> tuple[dict, list]:
    """Capture one graph set per budget and copy, as the budgeted helpers (packed language, vision) do; returns
    ``(graphs, fused_params)``: ``{budget: [graph set per copy]}`` and
    :func:`~bridge_cudagraph.capture.grad_buffers.fused_grad_params` of ``layers``.

    One pool per copy (``pools``, kept by the helper so that a later rung goes into the same one), its budgets
    captured into it largest first; ``capture_one(budget, copy, pool)`` captures copy ``copy``'s set of ``budget``.
    The contract that makes the rungs of a copy share one pool safely: within a copy one micro-batch replays one rung,
    forward then backward, before any other rung of that copy runs; copies never share a pool. Every capture keeps
    TE's clone of the returned parameter gradients (``clone_param_grads_on_return``, its default) unless a summing
    graph reads them on their own stream. Why each of these holds, and what breaks without it:
    ``docs/design/shared-pool.md`` and ``docs/design/param-grads.md``.

    ``sum_grads``: each copy's parameter gradients summed by graphs of their own once its rungs are captured
    (:func:`~bridge_cudagraph.capture.param_grads.sum_param_grads`).

    ``first``: the run's first capture. On failure: re-raised with ``on_capture_error="raise"``; else a first capture
    leaves the model eager (:func:`~bridge_cudagraph.capture.failure.abandon_capture`, the cause in ``stats.failed``),
    a later one (a ladder growing) keeps the graphs it has (:func:`~bridge_cudagraph.capture.failure.abandon_growth`);
    ``({}, [])`` comes back either way.
    """
    try:
        with measure(stats, add=not first), megatron_capturing():
            stats.param_grads_cloned = True
            captured = {}
            for budget in sorted(budgets, reverse=True):
                # TE's warmups cache blocks on their own streams; count the pool alone.
                before, live = held_reserved(), torch.cuda.memory_allocated()
                captured[budget] = [capture_one(budget, copy, pool) for copy, pool in enumerate(pools)]
                gc.collect()
                stats.per_budget[budget] = held_reserved() - before
                stats.per_budget_live[budget] = torch.cuda.memory_allocated() - live
            fused = fused_grad_params(layers)
            if sum_grads and captured:
                summed = [
                    sum_param_grads([sets[copy] for sets in captured.values()], layers, model_chunks, fused)
                    for copy in range(len(pools))
                ]
                stats.param_grads_summed = summed[0]
                if summed[0]:
                    stats.param_grads_cloned = False
            zero_grad_buffers(model_chunks)
            gc.collect()
    except Exception as error:
        if on_capture_error == "raise":
            raise
        if first:
            stats.failed = abandon_capture(layers, model_chunks, error, submodule)
        else:
            abandon_growth(model_chunks, error, submodule)
        return {}, []
    graphs = dict(sorted(captured.items()))
    stats.graphs += sum(len(g.layers) for sets in graphs.values() for g in sets)
    return graphs, fused
