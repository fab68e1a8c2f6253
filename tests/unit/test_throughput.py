"""Useful tokens per second: what the forward-step wrapper counts, and the rate over measured iterations."""

from __future__ import annotations

import inspect

import torch

from bridge_cudagraph.throughput import UsefulTokenMeter, counting_forward_step


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


def test_rate_is_tokens_over_time_between_marks(monkeypatch):
    meter = UsefulTokenMeter()
    clock = iter([10.0, 12.0, 14.0])
    monkeypatch.setattr("bridge_cudagraph.throughput.time.perf_counter", lambda: next(clock))
    meter.mark()
    meter.tokens = 100
    meter.mark()
    meter.tokens = 300
    meter.mark()
    assert meter.rate_since(0) == 300 / 4.0
    assert meter.rate_since(1) == 200 / 2.0
    assert meter.rate_since(2) is None
