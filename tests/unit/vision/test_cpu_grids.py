"""vision.cpu_grids: the collate's grids kept in the forward step's micro-batch, bound by identity to the tensors the
model receives, checked against their values; on CPU tensors (the binding does not depend on the device)."""

from __future__ import annotations

import pytest
import torch
from megatron.bridge.training.utils.visual_inputs import GenericVisualInputs

from bridge_cudagraph.micro_batch import CpuGrids, current_micro_batch, open_micro_batch
from bridge_cudagraph.vision import cpu_grids


def _collated(grid: torch.Tensor) -> dict:
    return {
        "input_ids": torch.zeros(2, 8, dtype=torch.long),
        "visual_inputs": GenericVisualInputs(image_grid_thw=grid),
    }


def test_the_collates_grid_is_kept_as_the_step_normalises_it_after_the_step_moves_the_batch():
    grid = torch.tensor([[[1, 8, 8], [1, 4, 6]], [[1, 2, 2], [1, 6, 4]]])  # [batch, images, 3]: the step flattens it
    batch = _collated(grid)
    got = cpu_grids.from_collated(batch)
    # Bridge's get_batch_from_iterator then replaces the visual tensors in the batch's own object, in place.
    visual = batch["visual_inputs"]
    for key, value in list(vars(visual).items()):
        if value is not None:
            visual.__dict__[key] = value.clone().fill_(0)
    assert got is not None and list(got.grids) == ["image_grid_thw"]
    assert torch.equal(got.grids["image_grid_thw"], grid.view(-1, 3))


def test_a_batch_without_cpu_grids_gives_none():
    assert cpu_grids.from_collated({"input_ids": torch.zeros(1, 4)}) is None
    assert cpu_grids.from_collated({"visual_inputs": GenericVisualInputs(pixel_values=torch.zeros(4, 3))}) is None
    assert cpu_grids.from_collated(None) is None


def test_a_drawn_batch_is_recorded_in_the_current_micro_batch_only():
    grid = torch.tensor([[1, 8, 8]])
    cpu_grids.record_collated(_collated(grid))  # outside a micro-batch: nowhere to keep it, nothing kept
    assert current_micro_batch() is None
    with open_micro_batch() as micro_batch:
        cpu_grids.record_collated(_collated(grid))
        assert torch.equal(micro_batch.cpu_grids.grids["image_grid_thw"], grid)
        cpu_grids.record_collated({"input_ids": torch.zeros(1, 4)})  # the next draw of the step replaces it
        assert micro_batch.cpu_grids is None


def test_a_bound_grid_is_found_for_the_very_tensor_the_forward_received_only():
    grid = torch.tensor([[1, 8, 8], [1, 4, 6]])
    model_grid = grid.clone()  # what the step moved: another tensor, the same values
    with open_micro_batch(CpuGrids({"image_grid_thw": grid})) as micro_batch:
        assert cpu_grids.bind(micro_batch, {"image_grid_thw": model_grid, "video_grid_thw": None}) == 1
        assert micro_batch.cpu_copy(model_grid) is grid
        assert micro_batch.cpu_copy(model_grid.clone()) is None  # a grid the forward built anew: read back
        assert cpu_grids.bind(micro_batch, {"image_grid_thw": model_grid[:1]}) == 0  # another shape: not bound
        assert micro_batch.cpu_copy(model_grid) is None
    assert micro_batch.cpu_copy(model_grid) is None  # the step has returned: nothing bound
    assert cpu_grids.bind(micro_batch, {"image_grid_thw": model_grid}) == 0  # nor anything to bind


def test_a_grid_whose_values_differ_is_refused_by_the_check():
    with open_micro_batch(CpuGrids({"image_grid_thw": torch.tensor([[1, 8, 8]])})) as micro_batch:
        with pytest.raises(RuntimeError, match="CPU grid differs"):
            cpu_grids.bind(micro_batch, {"image_grid_thw": torch.tensor([[1, 8, 6]])})


def test_the_grids_end_with_the_micro_batch_even_when_it_raises():
    grid = torch.tensor([[1, 2, 2]])
    with pytest.raises(ValueError), open_micro_batch(CpuGrids({"image_grid_thw": grid})) as micro_batch:
        cpu_grids.bind(micro_batch, {"image_grid_thw": grid})
        raise ValueError
    assert current_micro_batch() is None
    assert micro_batch.cpu_copy(grid) is None and cpu_grids.bind(micro_batch, {"image_grid_thw": grid}) == 0
