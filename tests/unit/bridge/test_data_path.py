"""bridge.data_path: Bridge's forward step with every micro-batch it draws seen by observers on the host first."""

from __future__ import annotations

import inspect

import pytest

from bridge_cudagraph.bridge.data_path import observing_forward_step


def _step(state, data_iterator, model, return_schedule_plan: bool = False):
    """A forward step of Bridge's shape: it draws one micro-batch."""
    return next(data_iterator)


def test_observers_see_each_drawn_batch_before_the_step_and_after_runs_per_call():
    seen, ends = [], []
    step = observing_forward_step(
        _step, [seen.append, lambda b: seen.append(("again", b))], after=lambda: ends.append(1)
    )
    assert list(inspect.signature(step).parameters) == ["state", "data_iterator", "model", "return_schedule_plan"]
    batches = iter(["a", "b"])
    assert step(None, batches, None) == "a"
    assert step(None, data_iterator=batches, model=None) == "b"
    assert seen == ["a", ("again", "a"), "b", ("again", "b")] and ends == [1, 1]


def test_after_runs_when_the_step_raises_and_a_missing_iterator_is_left_alone():
    ends = []

    def plain(data_iterator, model):
        if data_iterator is None:
            raise StopIteration
        return next(data_iterator)

    step = observing_forward_step(plain, [], after=lambda: ends.append(1))
    with pytest.raises(StopIteration):
        step(None, None)
    assert step(iter([3]), None) == 3 and ends == [1, 1]
