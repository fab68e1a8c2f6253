"""Bridge's forward step, with each collated micro-batch seen on the CPU before the step moves it to the GPU, inside
the micro-batch's context.

Bridge's forward steps draw their micro-batch themselves (``next(data_iterator)``) and move it to the GPU at once
(``get_batch``). Two parts of the plugin need what the collate made while it is still on the CPU, where reading it
costs no wait: the useful-token meter (:mod:`bridge_cudagraph.bridge.throughput`) and the vision grids
(:func:`bridge_cudagraph.vision.cpu_grids.record_collated`). :func:`observing_forward_step` wraps the step so that it
runs inside its own :class:`~bridge_cudagraph.micro_batch.MicroBatch` (:func:`~bridge_cudagraph.micro_batch.
open_micro_batch`, ended when the step returns or raises), and its data iterator hands each micro-batch it draws to
observers first.

The same wrapper times each draw (:class:`DataWait`): the seconds spent inside the data iterator's ``next()``, i.e.
how long the step waited for its batch. With DataLoader workers that keep up, a draw only takes a batch they made
ahead off a queue; when they fall behind (or with no workers), the step waits in ``next()`` for the collate (the
processor resizing and patching every image) to finish, and that wait is the data path's share of the step.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from bridge_cudagraph.micro_batch import open_micro_batch

__all__ = ["DataWait", "observing_forward_step"]


@dataclass
class DataWait:
    """Seconds the forward steps have spent inside their data iterator's ``next()``, summed over every draw."""

    seconds: float = 0.0
    """Seconds waited so far."""
    draws: int = 0
    """Draws timed so far (one per micro-batch; a draw that raised, such as the end of an evaluation set, too)."""

    def add(self, seconds: float) -> None:
        """Count one draw that took ``seconds``."""
        self.seconds += seconds
        self.draws += 1


class _ObservedIterator:
    """The step's data iterator, timing each draw and handing each micro-batch to the observers before the step
    sees it (the observers' own time is not the data's)."""

    def __init__(
        self, inner: Iterator, observers: Sequence[Callable[[Any], None]], wait: DataWait | None = None
    ) -> None:
        self.inner = inner
        self.observers = tuple(observers)
        self.wait = wait

    def __iter__(self) -> _ObservedIterator:
        return self

    def __next__(self) -> Any:
        start = time.perf_counter()
        try:
            batch = next(self.inner)
        finally:
            if self.wait is not None:
                self.wait.add(time.perf_counter() - start)
        for observe in self.observers:
            observe(batch)
        return batch


def observing_forward_step(
    step: Callable,
    observers: Sequence[Callable[[Any], None]],
    *,
    wait: DataWait | None = None,
) -> Callable:
    """``step`` (a Bridge forward step, ``(state, data_iterator, model, ...)`` or ``(data_iterator, model, ...)``)
    run inside a micro-batch of its own (:func:`~bridge_cudagraph.micro_batch.open_micro_batch`: what an observer
    put there ends with the step, also when it raises), whose data iterator hands each micro-batch it draws to
    ``observers``; ``wait``, when given, sums the time each draw spends in the iterator's ``next()``.

    ``functools.wraps`` keeps the signature Bridge inspects to decide whether to pass its state.
    """
    names = list(inspect.signature(step).parameters)
    position = (
        names.index("data_iterator") if "data_iterator" in names else int(names[:1] in (["state"], ["global_state"]))
    )

    def observed(iterator: Any) -> Any:
        if iterator is None:
            return iterator
        return _ObservedIterator(iterator, observers, wait)

    @functools.wraps(step)
    def wrapped(*args, **kwargs):
        if "data_iterator" in kwargs:
            kwargs["data_iterator"] = observed(kwargs["data_iterator"])
        elif len(args) > position:
            args = (*args[:position], observed(args[position]), *args[position + 1 :])
        with open_micro_batch():
            return step(*args, **kwargs)

    return wrapped
