"""Useful tokens per second: the tokens that carry loss, per second of training, as a Bridge callback.

Graphs and packing trade against each other (a padded graphed step computes padding; an eager packed step pays
host time), so step time alone cannot say which run trains faster: the number that can is how many tokens *with
loss* a second of training processes. :func:`counting_forward_step` wraps Bridge's forward step so that each
micro-batch's ``loss_mask`` is summed on the host, from the collated batch before the step moves it to the GPU
(no device sync); :class:`ThroughputCallback` times the training steps after warmup, capture and the first replay,
and reports the rate every ``logger.log_interval`` iterations and once at the end.

Next to it, the data wait: how much of those steps went to waiting for the next batch
(:class:`~bridge_cudagraph.bridge.data_path.DataWait`, the host time inside the data iterator's ``next()``). Graphs
shorten the GPU's part of a step, not the data path's; once the wait is a sizeable share of the step
(:data:`DATA_BOUND_SHARE`), the data is the limit, and the report says so with what to change (more DataLoader
workers, more CPU cores per GPU) instead of leaving a slow run to be blamed on the graphs. The wait is host time:
the first draw of a step waits with the GPU idle (the previous step ended on a synchronize), a later micro-batch's
draw may overlap kernels still queued; so the share bounds from above what faster data could save.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from megatron.bridge.training.callbacks import Callback

from bridge_cudagraph.bridge.data_path import DataWait, observing_forward_step

__all__ = [
    "DATA_BOUND_SHARE",
    "ThroughputCallback",
    "UsefulTokenMeter",
    "counting_forward_step",
    "data_bound_advice",
    "format_peak_memory",
    "peak_memory_line",
]

#: Share of the measured step time spent waiting for batches above which the report calls the data the limit.
DATA_BOUND_SHARE = 0.10


@dataclass
class UsefulTokenMeter:
    """Loss-carrying tokens of the micro-batches a forward step has drawn, on the host."""

    tokens: int = 0
    """Tokens counted so far (the loss mask's sum over every micro-batch drawn)."""
    micro_batches: int = 0
    """Micro-batches counted so far."""

    def add(self, batch: Any) -> None:
        """Count one collated micro-batch: its ``loss_mask`` sum (a CPU tensor in Bridge's collate)."""
        mask = batch.get("loss_mask") if isinstance(batch, dict) else None
        if mask is None:
            return
        self.tokens += int(mask.sum()) if mask.device.type == "cpu" else 0
        self.micro_batches += 1


def counting_forward_step(step: Callable, meter: UsefulTokenMeter) -> Callable:
    """``step`` (a Bridge forward step) counting each micro-batch it draws into ``meter``
    (:func:`~bridge_cudagraph.bridge.data_path.observing_forward_step`)."""
    return observing_forward_step(step, [meter.add])


class ThroughputCallback(Callback):
    """Reports useful tokens per second and the data wait (rank 0) every ``logger.log_interval`` iterations and at
    the end.

    Only the training steps are timed (from ``on_train_step_start`` to ``on_train_step_end``, with a device
    synchronize at the end so a step's kernels are inside its own interval): evaluation, checkpoints and logging
    between steps are not training speed. Steps before ``skip_iterations`` are not measured either.

    Args:
        meter: The meter the wrapped forward step counts into.
        skip_iterations: Steps after the loop's start (the loaded one on resume) not measured: the graphs' warmup,
            the capture step and the first replay (one-time plan building), the same number for graphed and eager
            runs so both are measured over the same iterations.
        wait: The data wait the wrapped forward step times its draws into
            (:func:`~bridge_cudagraph.bridge.data_path.observing_forward_step`); without one, no data-wait line.
    """

    def __init__(self, meter: UsefulTokenMeter, skip_iterations: int = 0, wait: DataWait | None = None) -> None:
        self.meter = meter
        self.skip_iterations = skip_iterations
        self.wait = wait
        self._measure_from: int | None = None
        self._started: tuple[float, int, float] | None = None
        self._advised = False
        self._num_workers: int | None = None
        self.seconds = 0.0
        """Training-step seconds measured so far."""
        self.tokens = 0
        """Useful tokens of the measured steps."""
        self.iterations = 0
        """Measured steps."""
        self.wait_seconds = 0.0
        """Seconds of the measured steps spent inside the data iterator's ``next()``."""

    def on_train_start(self, context) -> None:
        """Measure from ``skip_iterations`` after the loop's first step."""
        self._measure_from = context.state.train_state.step + self.skip_iterations
        self._num_workers = getattr(getattr(context.state.cfg, "dataset", None), "num_workers", None)

    def on_train_step_start(self, context) -> None:
        """Start a measured step (after a capture, which the graph callback runs before this one)."""
        self._started = None
        if context.state.train_state.step >= (self._measure_from or 0):
            self._started = (time.perf_counter(), self.meter.tokens, self._waited())

    def on_train_step_end(self, context) -> None:
        """End a measured step; report every ``log_interval`` iterations."""
        if self._started is not None:
            import torch

            if torch.cuda.is_available():
                torch.cuda.synchronize()
            start, tokens, waited = self._started
            self.seconds += time.perf_counter() - start
            self.tokens += self.meter.tokens - tokens
            self.wait_seconds += self._waited() - waited
            self.iterations += 1
            self._started = None
        iteration = context.state.train_state.step + 1
        interval = context.state.cfg.logger.log_interval
        if interval and iteration % interval == 0:
            self._report(f"iteration {iteration}")

    def on_train_end(self, context) -> None:
        """The summary lines over every measured step, and this rank's peak memory over the run."""
        self._report("end of training")
        line = peak_memory_line()
        if line:
            from megatron.bridge.utils.common_utils import print_rank_0

            print_rank_0(line)

    @property
    def useful_tokens_per_s(self) -> float | None:
        """Useful tokens per second of training step, or None before a measured step."""
        return self.tokens / self.seconds if self.seconds > 0 else None

    @property
    def data_wait_share(self) -> float | None:
        """Share of the measured step time spent waiting for batches, or None without a wait or a measured step."""
        return self.wait_seconds / self.seconds if self.wait is not None and self.seconds > 0 else None

    def _waited(self) -> float:
        return self.wait.seconds if self.wait is not None else 0.0

    def _report(self, when: str) -> None:
        from megatron.bridge.utils.common_utils import print_rank_0

        rate = self.useful_tokens_per_s
        if rate is None:
            return
        print_rank_0(
            f"bridge_cudagraph: useful tokens/s {rate:,.0f} (tokens with loss over {self.iterations} measured "
            f"training steps, {self.seconds:.2f} s; {when}; this rank's data-parallel share)"
        )
        share = self.data_wait_share
        if share is None:
            return
        step_ms, wait_ms = 1e3 * self.seconds / self.iterations, 1e3 * self.wait_seconds / self.iterations
        print_rank_0(
            f"bridge_cudagraph: data wait {wait_ms:.1f} ms of {step_ms:.1f} ms per step ({100 * share:.1f}%; time "
            f"inside the data iterator's next() over {self.iterations} measured steps; {when})"
        )
        # Said the first time, and again in the summary: not on every log line of a run that stays data-bound.
        if share > DATA_BOUND_SHARE and (not self._advised or when == "end of training"):
            self._advised = True
            print_rank_0(data_bound_advice(share, self._num_workers))


def peak_memory_line() -> str | None:
    """This rank's peak CUDA memory over the run, allocated and reserved (what a speed figure stands beside: a graph
    that does not fit is no speed-up), or None without CUDA."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return format_peak_memory(torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())


def format_peak_memory(allocated: int, reserved: int) -> str:
    """The peak-memory line of ``allocated`` and ``reserved`` bytes."""
    return (
        f"bridge_cudagraph: peak memory {allocated / 2**30:.1f} GiB allocated / {reserved / 2**30:.1f} GiB reserved "
        "(this rank)"
    )


def data_bound_advice(share: float, num_workers: int | None) -> str:
    """The line that says the data is the limit, with what to change: the DataLoader workers, and the CPU cores each
    GPU's process gets (this process's CPU affinity over the processes torchrun started on this node)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    workers = f"dataset.num_workers (now {num_workers})" if num_workers is not None else "dataset.num_workers"
    return (
        f"bridge_cudagraph: the data is the limit: steps wait {100 * share:.0f}% of their time for the next batch "
        f"(over {100 * DATA_BOUND_SHARE:.0f}%); raise {workers} while this node has cores to spare ({cores} CPU cores "
        f"for {per_node} GPU process{'es' if per_node != 1 else ''} here), or run with more CPU cores per GPU"
    )
