"""micro_batch: one context per micro-batch, opened by the forward step and closed when it returns or raises; readers
see None outside one; a micro-batch opened inside another is refused, a model forward outside any opens its own, and
a reference kept past the end reads an empty one."""

from __future__ import annotations

import contextvars
import threading

import pytest
import torch

from bridge_cudagraph.bridge.data_path import observing_forward_step
from bridge_cudagraph.micro_batch import (
    CpuGrids,
    MicroBatch,
    current_micro_batch,
    open_micro_batch,
    within_micro_batch,
)
from bridge_cudagraph.vision.cpu_grids import record_collated


def test_readers_see_nothing_outside_a_micro_batch():
    assert current_micro_batch() is None
    with open_micro_batch() as micro_batch:
        assert current_micro_batch() is micro_batch and micro_batch.open
    assert current_micro_batch() is None and not micro_batch.open


def test_the_forward_step_opens_one_per_call_and_closes_it_when_it_returns():
    seen: list[MicroBatch] = []

    def step(data_iterator, model):
        batch = next(data_iterator)
        seen.append(current_micro_batch())
        return batch

    wrapped = observing_forward_step(step, [lambda batch: seen.append(current_micro_batch())])
    batches = iter([1, 2])
    assert wrapped(batches, None) == 1 and wrapped(batches, None) == 2
    first, first_in_step, second, second_in_step = seen
    # The observer and the step see the same micro-batch; each call has its own, closed once the call returned.
    assert first is first_in_step and second is second_in_step and first is not second
    assert not first.open and not second.open and current_micro_batch() is None


def test_the_forward_steps_micro_batch_holds_the_collates_grids_until_it_returns():
    grid = torch.tensor([[1, 4, 4]])
    held = []

    def step(data_iterator, model):
        next(data_iterator)
        held.append(current_micro_batch().cpu_grids)
        return None

    from megatron.bridge.training.utils.visual_inputs import GenericVisualInputs

    wrapped = observing_forward_step(step, [record_collated])
    wrapped(iter([{"visual_inputs": GenericVisualInputs(image_grid_thw=grid)}]), None)
    assert torch.equal(held[0].grids["image_grid_thw"], grid) and current_micro_batch() is None


def test_an_exception_closes_it_and_clears_every_field():
    with pytest.raises(RuntimeError, match="the step failed"), open_micro_batch(CpuGrids({})) as micro_batch:
        micro_batch.bound_grids = ((torch.zeros(1), torch.zeros(1)),)
        micro_batch.row_extents = (object(), (3,))
        micro_batch.pending_positions = object()
        raise RuntimeError("the step failed")
    assert current_micro_batch() is None
    assert (micro_batch.cpu_grids, micro_batch.bound_grids, micro_batch.row_extents) == (None, (), None)
    assert micro_batch.pending_positions is None and not micro_batch.open


def test_the_forward_step_closes_it_when_the_step_raises():
    kept = []

    def failing(data_iterator, model):
        kept.append(current_micro_batch())
        raise StopIteration

    with pytest.raises(StopIteration):
        observing_forward_step(failing, [])(iter([]), None)
    assert current_micro_batch() is None and not kept[0].open


def test_a_micro_batch_inside_another_is_refused_and_leaves_the_outer_one_current():
    with open_micro_batch() as outer:
        with pytest.raises(RuntimeError, match="opened inside another"), open_micro_batch():
            pass
        assert current_micro_batch() is outer and outer.open


def test_a_model_forward_joins_the_steps_micro_batch_or_opens_its_own():
    with open_micro_batch() as step_batch, within_micro_batch() as joined:
        assert joined is step_batch
    with within_micro_batch() as own:
        assert current_micro_batch() is own and own.open
        with within_micro_batch() as nested:
            assert nested is own  # a forward inside a forward joins too
    assert current_micro_batch() is None and not own.open


def test_a_reference_kept_past_the_end_reads_an_empty_micro_batch():
    params = object()
    grid = torch.tensor([[1, 2, 2]])
    with open_micro_batch(CpuGrids({"image_grid_thw": grid})) as micro_batch:
        micro_batch.row_extents = (params, (5, 7))
        micro_batch.bound_grids = ((grid, grid),)
        assert micro_batch.row_extents_for(params) == (5, 7) and micro_batch.row_extents_for(object()) is None
        assert micro_batch.cpu_copy(grid) is grid
    assert micro_batch.row_extents_for(params) is None and micro_batch.cpu_copy(grid) is None


def test_another_thread_sees_none_and_a_copied_context_sees_the_step_s():
    """A context variable is per thread: autograd's and a data loader's threads see no micro-batch; a context copied
    on purpose (``contextvars.copy_context``) carries it."""
    seen = []
    with open_micro_batch() as micro_batch:
        thread = threading.Thread(target=lambda: seen.append(current_micro_batch()))
        thread.start()
        thread.join()
        copied = contextvars.copy_context().run(current_micro_batch)
    assert seen == [None] and copied is micro_batch
