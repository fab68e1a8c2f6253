"""Bridge's forward step, with each collated micro-batch seen on the host before the step moves it to the GPU.

Bridge's forward steps draw their micro-batch themselves (``next(data_iterator)``) and move it to the GPU at once
(``get_batch``). Two parts of the plugin need what the collate made while it is still on the host, where reading it
costs no wait: the useful-token meter (:mod:`bridge_cudagraph.bridge.throughput`) and the vision grids
(:mod:`bridge_cudagraph.vision.host_grids`). :func:`observing_forward_step` wraps the step so that its data iterator
hands each micro-batch it draws to observers first, and runs ``after`` when the step returns.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["observing_forward_step"]


class _ObservedIterator:
    """The step's data iterator, handing each micro-batch to the observers before the step sees it."""

    def __init__(self, inner: Iterator, observers: Sequence[Callable[[Any], None]]) -> None:
        self.inner = inner
        self.observers = tuple(observers)

    def __iter__(self) -> _ObservedIterator:
        return self

    def __next__(self) -> Any:
        batch = next(self.inner)
        for observe in self.observers:
            observe(batch)
        return batch


def observing_forward_step(
    step: Callable, observers: Sequence[Callable[[Any], None]], *, after: Callable[[], None] | None = None
) -> Callable:
    """``step`` (a Bridge forward step, ``(state, data_iterator, model, ...)`` or ``(data_iterator, model, ...)``)
    whose data iterator hands each micro-batch it draws to ``observers``; ``after()`` runs when the step returns or
    raises (what an observer published for this step ends there).

    ``functools.wraps`` keeps the signature Bridge inspects to decide whether to pass its state.
    """
    names = list(inspect.signature(step).parameters)
    position = (
        names.index("data_iterator") if "data_iterator" in names else int(names[:1] in (["state"], ["global_state"]))
    )

    def observed(iterator: Any) -> Any:
        if iterator is None:
            return iterator
        return _ObservedIterator(iterator, observers)

    @functools.wraps(step)
    def wrapped(*args, **kwargs):
        if "data_iterator" in kwargs:
            kwargs["data_iterator"] = observed(kwargs["data_iterator"])
        elif len(args) > position:
            args = (*args[:position], observed(args[position]), *args[position + 1 :])
        try:
            return step(*args, **kwargs)
        finally:
            if after is not None:
                after()

    return wrapped
