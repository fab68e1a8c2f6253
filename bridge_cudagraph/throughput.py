"""Useful tokens per second: the tokens that carry loss, per second of training, as a Bridge callback.

Graphs and packing trade against each other (a padded graphed step computes padding; an eager packed step pays
host time), so step time alone cannot say which run trains faster: the number that can is how many tokens *with
loss* a second of training processes. :func:`counting_forward_step` wraps Bridge's forward step so that each
micro-batch's ``loss_mask`` is summed on the host, from the collated batch before the step moves it to the GPU
(no device sync); :class:`ThroughputCallback` reports the rate every ``logger.log_interval`` iterations and once
at the end, over the iterations after the last capture (so capture time is not in it).
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from megatron.bridge.training.callbacks import Callback

__all__ = ["ThroughputCallback", "UsefulTokenMeter", "counting_forward_step"]


@dataclass
class UsefulTokenMeter:
    """Loss-carrying tokens of the micro-batches a forward step has drawn, on the host."""

    tokens: int = 0
    """Tokens counted so far (the loss mask's sum over every micro-batch drawn)."""
    micro_batches: int = 0
    """Micro-batches counted so far."""
    _marks: list[tuple[int, float]] = field(default_factory=list)

    def add(self, batch: Any) -> None:
        """Count one collated micro-batch: its ``loss_mask`` sum (a CPU tensor in Bridge's collate)."""
        mask = batch.get("loss_mask") if isinstance(batch, dict) else None
        if mask is None:
            return
        self.tokens += int(mask.sum()) if mask.device.type == "cpu" else 0
        self.micro_batches += 1

    def mark(self) -> None:
        """Remember the count and the time now (a step boundary)."""
        self._marks.append((self.tokens, time.perf_counter()))

    def rate_since(self, index: int) -> float | None:
        """Useful tokens per second from mark ``index`` to the last mark, or None with fewer than two marks."""
        if len(self._marks) < 2 or index >= len(self._marks) - 1:
            return None
        (t0, s0), (t1, s1) = self._marks[index], self._marks[-1]
        return (t1 - t0) / (s1 - s0) if s1 > s0 else None


class _CountingIterator:
    """The step's data iterator, counting each micro-batch it hands out."""

    def __init__(self, inner: Iterator, meter: UsefulTokenMeter) -> None:
        self.inner = inner
        self.meter = meter

    def __iter__(self) -> _CountingIterator:
        return self

    def __next__(self) -> Any:
        batch = next(self.inner)
        self.meter.add(batch)
        return batch


def counting_forward_step(step: Callable, meter: UsefulTokenMeter) -> Callable:
    """``step`` (a Bridge forward step, ``(state, data_iterator, model, ...)`` or ``(data_iterator, model, ...)``)
    counting into ``meter``.

    ``functools.wraps`` keeps the signature Bridge inspects to decide whether to pass its state.
    """
    names = list(inspect.signature(step).parameters)
    position = (
        names.index("data_iterator") if "data_iterator" in names else int(names[:1] in (["state"], ["global_state"]))
    )

    def counting(iterator: Any) -> Any:
        if iterator is None or isinstance(iterator, _CountingIterator):
            return iterator
        return _CountingIterator(iterator, meter)

    @functools.wraps(step)
    def counted(*args, **kwargs):
        if "data_iterator" in kwargs:
            kwargs["data_iterator"] = counting(kwargs["data_iterator"])
        elif len(args) > position:
            args = (*args[:position], counting(args[position]), *args[position + 1 :])
        return step(*args, **kwargs)

    return counted


class ThroughputCallback(Callback):
    """Reports useful tokens per second (rank 0) every ``logger.log_interval`` iterations and at the end.

    Args:
        meter: The meter the wrapped forward step counts into.
        skip_iterations: Iterations after the loop's start (the loaded one on resume) not measured: the graphs'
            warmup and capture, so graphed and eager runs are measured over the same iterations.
    """

    def __init__(self, meter: UsefulTokenMeter, skip_iterations: int = 0) -> None:
        self.meter = meter
        self.skip_iterations = skip_iterations
        self._measure_from: int | None = None
        self._start_index: int | None = None
        self._iterations: list[int] = []
        self.summary: dict[str, Any] = {}
        """The last report: ``useful_tokens_per_s``, ``iterations`` measured, ``tokens``."""

    def on_train_start(self, context) -> None:
        """Measure from ``skip_iterations`` after the loop's first step."""
        self._measure_from = context.state.train_state.step + self.skip_iterations

    def on_train_step_start(self, context) -> None:
        """Mark the boundary (after a capture, which happens in the graph callback's step start)."""
        self._mark(context.state.train_state.step)

    def on_train_step_end(self, context) -> None:
        """Report every ``log_interval`` iterations."""
        iteration = context.state.train_state.step + 1
        self._mark(iteration)
        interval = context.state.cfg.logger.log_interval
        if interval and iteration % interval == 0:
            self._report(f"iteration {iteration}")

    def on_train_end(self, context) -> None:
        """The summary line over every measured iteration."""
        self._report("end of training")

    def _mark(self, iteration: int) -> None:
        self.meter.mark()
        self._iterations.append(iteration)
        if self._start_index is None and iteration >= (self._measure_from or 0):
            self._start_index = len(self._iterations) - 1

    def _report(self, when: str) -> None:
        from megatron.bridge.utils.common_utils import print_rank_0

        if self._start_index is None:
            return
        rate = self.meter.rate_since(self._start_index)
        if rate is None:
            return
        measured = self._iterations[-1] - self._iterations[self._start_index]
        self.summary = {"useful_tokens_per_s": rate, "iterations": measured, "tokens": self.meter.tokens}
        print_rank_0(
            f"bridge_cudagraph: useful tokens/s {rate:,.0f} (tokens with loss, over {measured} iterations after "
            f"capture, {when}; this rank's data-parallel share)"
        )
