"""Useful tokens per second: what the forward-step wrapper counts, and the rate over measured iterations; the data
wait beside it, and the line that calls the data the limit."""

from __future__ import annotations

import inspect
import re
import time

import torch

from bridge_cudagraph.bridge.throughput import DATA_BOUND_SHARE, UsefulTokenMeter, counting_forward_step


def _step(state, data_iterator, model, return_schedule_plan: bool = False):
    """A forward step of Bridge's shape: it draws one micro-batch."""
    return next(data_iterator)


def test_the_wrapped_step_counts_loss_tokens_and_keeps_bridge_s_signature():
    meter = UsefulTokenMeter()
    step = counting_forward_step(_step, meter)
    assert list(inspect.signature(step).parameters) == ["state", "data_iterator", "model", "return_schedule_plan"]
    batches = iter([{"loss_mask": torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])}, {"loss_mask": torch.ones(2, 4)}])
    step(None, batches, None)
    step(None, data_iterator=batches, model=None)
    assert (meter.tokens, meter.micro_batches) == (3 + 8, 2)


def test_a_step_without_state_is_wrapped_at_its_data_iterator():
    meter = UsefulTokenMeter()

    def plain(data_iterator, model):
        return next(data_iterator)

    counting_forward_step(plain, meter)(iter([{"loss_mask": torch.ones(1, 5)}]), None)
    assert meter.tokens == 5


def test_only_measured_training_steps_count(monkeypatch):
    from types import SimpleNamespace

    from bridge_cudagraph.bridge.throughput import ThroughputCallback

    meter = UsefulTokenMeter()
    clock = iter([10.0, 11.0, 50.0, 52.0])  # a 1 s step, a gap (evaluation), a 2 s step
    monkeypatch.setattr("bridge_cudagraph.bridge.throughput.time.perf_counter", lambda: next(clock))
    cb = ThroughputCallback(meter, skip_iterations=1)

    def context(step):
        state = SimpleNamespace(
            train_state=SimpleNamespace(step=step), cfg=SimpleNamespace(logger=SimpleNamespace(log_interval=0))
        )
        return SimpleNamespace(state=state)

    cb.on_train_start(context(0))
    for step, tokens in [(0, 999), (1, 100), (2, 300)]:
        cb.on_train_step_start(context(step))
        meter.tokens += tokens
        cb.on_train_step_end(context(step))
    assert (cb.iterations, cb.tokens, cb.seconds) == (2, 400, 3.0)
    assert cb.useful_tokens_per_s == 400 / 3.0


def _context(step, workers=2):
    from types import SimpleNamespace

    cfg = SimpleNamespace(logger=SimpleNamespace(log_interval=0), dataset=SimpleNamespace(num_workers=workers))
    return SimpleNamespace(state=SimpleNamespace(train_state=SimpleNamespace(step=step), cfg=cfg))


def _train(batches, work_s: float, steps: int = 4):
    """Bridge's loop around a wrapped step, in miniature: the callback's events around each step, then the end."""
    from bridge_cudagraph.bridge.data_path import DataWait, observing_forward_step
    from bridge_cudagraph.bridge.throughput import ThroughputCallback

    meter, wait = UsefulTokenMeter(), DataWait()

    def working(state, data_iterator, model):
        batch = next(data_iterator)
        time.sleep(work_s)
        return batch

    step = observing_forward_step(working, [meter.add], wait=wait)
    cb = ThroughputCallback(meter, skip_iterations=1, wait=wait)
    cb.on_train_start(_context(0))
    for i in range(steps):
        cb.on_train_step_start(_context(i))
        step(None, batches, None)
        cb.on_train_step_end(_context(i))
    cb.on_train_end(_context(steps))
    return cb


def _slow(seconds):
    while True:
        time.sleep(seconds)
        yield {"loss_mask": torch.ones(1, 4)}


def test_a_step_that_waits_for_its_batches_is_reported_data_bound(capsys):
    cb = _train(_slow(0.08), work_s=0.02)
    out = capsys.readouterr().out
    assert cb.iterations == 3 and cb.tokens == 12 and 0.24 <= cb.wait_seconds <= cb.seconds
    assert cb.data_wait_share > 0.5
    (line,) = [x for x in out.splitlines() if "data wait" in x]
    assert re.search(r"data wait \d+\.\d ms of \d+\.\d ms per step \(\d+\.\d%", line)
    (advice,) = [x for x in out.splitlines() if "the data is the limit" in x]
    assert "dataset.num_workers (now 2)" in advice and "CPU cores" in advice


def test_a_step_whose_batches_are_ready_is_not(capsys):
    batches = iter([{"loss_mask": torch.ones(1, 4)}] * 4)
    cb = _train(batches, work_s=0.05)
    out = capsys.readouterr().out
    assert cb.iterations == 3 and cb.data_wait_share < DATA_BOUND_SHARE
    assert "data wait" in out and "the data is the limit" not in out


def test_without_a_data_wait_there_is_no_line(capsys):
    from bridge_cudagraph.bridge.throughput import ThroughputCallback

    meter = UsefulTokenMeter()
    cb = ThroughputCallback(meter)
    cb.on_train_start(_context(0))
    cb.on_train_step_start(_context(0))
    meter.tokens += 5
    cb.on_train_step_end(_context(0))
    cb.on_train_end(_context(1))
    out = capsys.readouterr().out
    assert "useful tokens/s" in out and "data wait" not in out and cb.data_wait_share is None
