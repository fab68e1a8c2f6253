"""Useful tokens per second: what the forward-step wrapper counts, and the rate over measured iterations."""

from __future__ import annotations

import inspect

import torch

from bridge_cudagraph.bridge.throughput import UsefulTokenMeter, counting_forward_step


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
