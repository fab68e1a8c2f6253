"""Independent graph sets of one helper, for schedules that keep micro-batches in flight: which are free, and freeing
their graphs."""

from __future__ import annotations

import torch

from bridge_cudagraph.capture.checks import CaptureError

__all__ = ["GraphCopies", "reset_graph_sets"]


class GraphCopies:
    """Which of ``count`` independent graph sets are free, for schedules that keep micro-batches in flight.

    A set is taken by a micro-batch's forward and given back when that micro-batch's backward reaches the sets'
    output. A backward runs to completion before the schedule starts another forward, so giving the set back as
    the gradient arrives (just before the layers' backward graphs replay) is safe. Without a backward through
    the graphs (no gradient needed), the set is free again at once.
    """

    def __init__(self, count: int) -> None:
        if count < 1:
            raise CaptureError(f"graph copies must be >= 1, got {count}")
        self.count = count
        self._busy = [False] * count

    def acquire(self) -> int | None:
        """A free set, marked busy; None when every set is in flight."""
        for index, busy in enumerate(self._busy):
            if not busy:
                self._busy[index] = True
                return index
        return None

    def release_after_backward(self, index: int, output: torch.Tensor) -> None:
        """Free set ``index`` when the gradient of ``output`` (the sets' last output) is computed."""
        if torch.is_grad_enabled() and output.requires_grad:

            def free(grad, index=index):
                self._busy[index] = False
                return grad

            output.register_hook(free)
        else:
            self._busy[index] = False

    def release_now(self, index: int) -> None:
        """Free set ``index`` at once (a forward that took it and failed before any replay)."""
        self._busy[index] = False

    def in_flight(self) -> int:
        """Sets taken by micro-batches whose backward has not reached them yet."""
        return sum(self._busy)

    def reset(self) -> None:
        """Every set free (after capture, deletion, or an aborted step)."""
        self._busy = [False] * self.count


def reset_graph_sets(graphs) -> None:
    """Free the TE graphs of ``{budget: [graph set, ...]}`` (each set's ``layers`` are TE graphed callables,
    whose ``reset()`` releases their graph state)."""
    for copies in graphs.values():
        for graph_set in copies:
            for graph in graph_set.layers:
                reset = getattr(graph, "reset", None)
                if reset is not None:
                    reset()
