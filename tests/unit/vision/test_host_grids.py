"""vision.host_grids: the collate's grids published for one forward step, bound by identity to the tensors the model
receives, checked against their values; on CPU tensors (the binding does not depend on the device)."""

from __future__ import annotations

import pytest
import torch
from megatron.bridge.training.utils.visual_inputs import GenericVisualInputs

from bridge_cudagraph.vision import host_grids
from bridge_cudagraph.vision.host_grids import HostGrids


@pytest.fixture(autouse=True)
def _nothing_left_published():
    host_grids.clear()
    yield
    host_grids.clear()


def _collated(grid: torch.Tensor) -> dict:
    return {
        "input_ids": torch.zeros(2, 8, dtype=torch.long),
        "visual_inputs": GenericVisualInputs(image_grid_thw=grid),
    }


def test_the_collates_grid_is_kept_as_the_step_normalises_it_after_the_step_moves_the_batch():
    grid = torch.tensor([[[1, 8, 8], [1, 4, 6]], [[1, 2, 2], [1, 6, 4]]])  # [batch, images, 3]: the step flattens it
    batch = _collated(grid)
    got = host_grids.from_collated(batch)
    # Bridge's get_batch_from_iterator then replaces the visual tensors in the batch's own object, in place.
    visual = batch["visual_inputs"]
    for key, value in list(vars(visual).items()):
        if value is not None:
            visual.__dict__[key] = value.clone().fill_(0)
    assert got is not None and list(got.grids) == ["image_grid_thw"]
    assert torch.equal(got.grids["image_grid_thw"], grid.view(-1, 3))


def test_a_batch_without_host_grids_publishes_none():
    assert host_grids.from_collated({"input_ids": torch.zeros(1, 4)}) is None
    assert host_grids.from_collated({"visual_inputs": GenericVisualInputs(pixel_values=torch.zeros(4, 3))}) is None
    assert host_grids.from_collated(None) is None


def test_a_bound_grid_is_found_for_the_very_tensor_the_forward_received_only():
    grid = torch.tensor([[1, 8, 8], [1, 4, 6]])
    model_grid = grid.clone()  # what the step moved: another tensor, the same values
    with host_grids.published(HostGrids({"image_grid_thw": grid})):
        assert host_grids.bind({"image_grid_thw": model_grid, "video_grid_thw": None}) == 1
        assert host_grids.host_copy(model_grid) is grid
        assert host_grids.host_copy(model_grid.clone()) is None  # a grid the forward built anew: read back
        host_grids.unbind()
        assert host_grids.host_copy(model_grid) is None
        assert host_grids.bind({"image_grid_thw": model_grid[:1]}) == 0  # another shape: not bound
    assert host_grids.bind({"image_grid_thw": model_grid}) == 0  # the step has returned: nothing published


def test_a_grid_whose_values_differ_is_refused_by_the_check():
    with host_grids.published(HostGrids({"image_grid_thw": torch.tensor([[1, 8, 8]])})):
        with pytest.raises(RuntimeError, match="published host grid differs"):
            host_grids.bind({"image_grid_thw": torch.tensor([[1, 8, 6]])})


def test_publishing_ends_with_the_block_even_when_it_raises():
    grid = torch.tensor([[1, 2, 2]])
    with pytest.raises(ValueError), host_grids.published(HostGrids({"image_grid_thw": grid})):
        host_grids.bind({"image_grid_thw": grid})
        raise ValueError
    assert host_grids.host_copy(grid) is None and host_grids.bind({"image_grid_thw": grid}) == 0
