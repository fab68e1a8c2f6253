"""What :mod:`bridge_cudagraph.capture.param_grads` changes of Transformer Engine's graphed callables and of
megatron-core's parameters, so that a ladder's graphs can hand their parameter gradients to ``main_grad`` themselves.

Host change:
  changes: the clone flags Transformer Engine keeps for one graphed callable's parameter gradients (the closure cell
    ``returned_param_grad_clone_slots`` of its ``Graphed.backward``, found by
    :func:`~bridge_cudagraph.host.compat.te_graphed_backward_state`): False for the parameters whose gradients a graph
    of this package sums (:func:`stop_cloning`)
  written for: Transformer Engine 2.20 ``pytorch/graph.py`` (``_make_graphed_callables``)
  gate: the proven stack; :func:`~bridge_cudagraph.host.compat.te_graphed_backward_state` finds the cells; every
    trainable parameter of the graphed layers owned by megatron-core's DDP
  undo: the callable returned by :func:`stop_cloning` (the graphs' deletion calls it)

Host change:
  changes: ``_cudagraph_wgrad_ready_event`` on those parameters (:func:`mark_wgrad_ready`): megatron-core's own mark
    for a gradient a CUDA graph wrote into ``main_grad``, under which DDP's hook accepts a ``None`` gradient with
    ``overlap_grad_reduce`` and ``finish_grad_sync`` waits for the event before reducing
  written for: megatron-core 0.19.2 ``distributed_data_parallel.py`` (``_make_backward_post_hook``),
    ``param_and_grad_buffer.py`` (``finish_grad_sync``)
  gate: as above
  undo: :func:`unmark_wgrad_ready`

Why TE's flags: TE 2.20 clones each parameter gradient a backward replay returns when the graphs were captured
with ``clone_param_grads_on_return`` (its default, which every capture here keeps:
:func:`~bridge_cudagraph.capture.ladder_capture.capture_budget_ladder` says why). Once a graph of this package has
summed the gradients, the clones are copies nobody reads; TE offers no switch after capture.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["WGRAD_READY", "mark_wgrad_ready", "stop_cloning", "unmark_wgrad_ready"]

#: The parameter attribute megatron-core 0.19.2's DDP reads for a gradient a CUDA graph wrote into ``main_grad``.
WGRAD_READY = "_cudagraph_wgrad_ready_event"


def stop_cloning(slots_cell: Any, first: int, handled: Sequence[bool]) -> Callable[[], None]:
    """Turn off TE's clone of the parameter gradients marked in ``handled`` (the parameters from slot ``first`` on);
    returns the undo, which puts the flags back as they were."""
    original = slots_cell.cell_contents
    slots = list(original)
    for i, yes in enumerate(handled):
        if yes:
            slots[first + i] = False
    slots_cell.cell_contents = tuple(slots)

    def undo() -> None:
        slots_cell.cell_contents = original

    return undo


def mark_wgrad_ready(params: Sequence[Any], event: Any) -> None:
    """Set megatron-core's mark on ``params``: their gradients reach ``main_grad`` by a graph, ready at ``event``."""
    for param in params:
        setattr(param, WGRAD_READY, event)


def unmark_wgrad_ready(params: Sequence[Any], event: Any) -> None:
    """Take the mark off ``params`` where it is still ``event`` (another ladder's may have replaced it)."""
    for param in params:
        if getattr(param, WGRAD_READY, None) is event:
            delattr(param, WGRAD_READY)
