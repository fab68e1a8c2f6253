"""bridge.data_path: Bridge's forward step inside a micro-batch of its own, with every micro-batch it draws seen by
observers on the CPU first, and the time each draw waits for its batch."""

from __future__ import annotations

import inspect
import time

import pytest

from bridge_cudagraph.bridge.data_path import DataWait, observing_forward_step
from bridge_cudagraph.micro_batch import current_micro_batch


def _step(state, data_iterator, model, return_schedule_plan: bool = False):
    """A forward step of Bridge's shape: it draws one micro-batch."""
    return next(data_iterator)


def test_observers_see_each_drawn_batch_before_the_step_inside_its_micro_batch():
    seen, ends = [], []

    def step(state, data_iterator, model, return_schedule_plan: bool = False):
        """A forward step of Bridge's shape: it draws one micro-batch."""
        batch = next(data_iterator)
        ends.append(current_micro_batch())
        return batch

    wrapped = observing_forward_step(step, [seen.append, lambda b: seen.append(("again", b, current_micro_batch()))])
    assert list(inspect.signature(wrapped).parameters) == ["state", "data_iterator", "model", "return_schedule_plan"]
    batches = iter(["a", "b"])
    assert wrapped(None, batches, None) == "a"
    assert wrapped(None, data_iterator=batches, model=None) == "b"
    assert seen == ["a", ("again", "a", ends[0]), "b", ("again", "b", ends[1])]
    assert ends[0] is not ends[1] and not any(m.open for m in ends) and current_micro_batch() is None


def test_the_micro_batch_ends_when_the_step_raises_and_a_missing_iterator_is_left_alone():
    during = []

    def plain(data_iterator, model):
        during.append(current_micro_batch())
        if data_iterator is None:
            raise StopIteration
        return next(data_iterator)

    step = observing_forward_step(plain, [])
    with pytest.raises(StopIteration):
        step(None, None)
    assert step(iter([3]), None) == 3 and len(during) == 2 and not any(m.open for m in during)
    assert current_micro_batch() is None


def _slow(items, seconds):
    """An iterator that takes ``seconds`` to produce each item, as a data loader whose workers fall behind."""
    for item in items:
        time.sleep(seconds)
        yield item


def test_a_slow_iterator_shows_its_wait_and_a_ready_one_none():
    slow, ready = DataWait(), DataWait()

    def working(data_iterator, model):
        batch = next(data_iterator)
        time.sleep(0.06)  # the step's own work: not the data's
        return batch

    def busy_observer(batch):
        time.sleep(0.06)  # the plugin's host work on the batch: not the data's either

    step = observing_forward_step(working, [busy_observer], wait=slow)
    batches = _slow(range(3), 0.05)
    assert [step(batches, None) for _ in range(3)] == [0, 1, 2]
    assert slow.draws == 3 and 0.15 <= slow.seconds < 0.15 + 0.15  # the step and observer would add 0.36

    step = observing_forward_step(working, [busy_observer], wait=ready)
    batches = iter(range(3))
    assert [step(batches, None) for _ in range(3)] == [0, 1, 2]
    assert ready.draws == 3 and ready.seconds < 0.01


def test_a_data_loaders_wait_is_timed_and_the_end_of_its_data_counts_as_a_draw():
    """A real ``torch.utils.data.DataLoader`` without workers: the step waits for each ``__getitem__``."""
    import torch

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, index):
            time.sleep(0.02)
            return torch.tensor([index])

    wait = DataWait()
    step = observing_forward_step(_step, [], wait=wait)
    batches = iter(torch.utils.data.DataLoader(Slow(), batch_size=2))
    for _ in range(2):
        step(None, batches, None)
    with pytest.raises(StopIteration):
        step(None, batches, None)
    assert wait.draws == 3 and wait.seconds >= 4 * 0.02
