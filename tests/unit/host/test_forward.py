"""host.forward's install record and the mixins' per-micro-batch state, on the CPU with plain modules in place of
Bridge's ``Qwen3VLModel`` (its TE layers need a GPU: the GPU tests install on the real model,
``tests/gpu/test_bridge_reference.py``): the grids bound for one forward in the forward step's micro-batch, or in one
of the forward's own; the flat rows reading only their own model's pending positions; one mixin taken off alone."""

from __future__ import annotations

import types

import pytest
import torch

from bridge_cudagraph.host import forward as forward_host
from bridge_cudagraph.host.bound_grids import BoundGrids
from bridge_cudagraph.host.flat_rows import FlatPackedRows
from bridge_cudagraph.host.forward_counts import attach_counts, counts_of
from bridge_cudagraph.host.instance_class import extend_instance_class
from bridge_cudagraph.micro_batch import CpuGrids, current_micro_batch, open_micro_batch


class _Model(torch.nn.Module):
    """A forward that records, per call, the micro-batch it ran in and the CPU copy bound to its grid."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.fail = fail
        self.seen: list = []

    def forward(self, **kwargs):
        micro_batch = current_micro_batch()
        grid = kwargs.get("image_grid_thw")
        self.seen.append((micro_batch, None if grid is None else micro_batch.cpu_copy(grid)))
        if self.fail:
            raise RuntimeError("the forward failed")
        return kwargs


def _bound(**kwargs) -> tuple[_Model, forward_host.ForwardInstall]:
    """A model with :class:`BoundGrids` put on as :func:`~bridge_cudagraph.host.forward.install` puts it."""
    model = _Model(**kwargs)
    record = forward_host.ForwardInstall(pairs=[(model, BoundGrids)])
    extend_instance_class(model, BoundGrids)
    attach_counts(model, record.counts)
    return model, record


def test_the_grids_are_bound_for_the_forward_inside_the_steps_micro_batch_and_unbound_after():
    model, record = _bound()
    grid = torch.tensor([[1, 4, 4]])
    device_grid = grid.clone()  # what the step moved: another tensor
    with open_micro_batch(CpuGrids({"image_grid_thw": grid})) as micro_batch:
        model(image_grid_thw=device_grid)
        assert model.seen == [(micro_batch, grid)] and micro_batch.bound_grids == ()
    assert forward_host.counts(record)["grid_binds"] == 1


def test_outside_a_step_the_forward_runs_in_its_own_micro_batch_with_nothing_bound():
    model, record = _bound()
    model(image_grid_thw=torch.tensor([[1, 4, 4]]))
    ((own, copy),) = model.seen
    assert own is not None and not own.open and copy is None and current_micro_batch() is None
    assert forward_host.counts(record)["grid_binds"] == 0


def test_a_forward_that_raises_leaves_nothing_bound():
    model, _ = _bound(fail=True)
    grid = torch.tensor([[1, 4, 4]])
    with open_micro_batch(CpuGrids({"image_grid_thw": grid})) as micro_batch:
        with pytest.raises(RuntimeError, match="the forward failed"):
            model(image_grid_thw=grid.clone())
        assert micro_batch.bound_grids == ()


def test_the_flat_rows_read_only_their_own_models_pending_positions():
    """A mask the rows come with must be checked on the CPU copy: only the pending positions of this very model's
    forward check it; another's, or none, leave the rows to Bridge."""
    model = _Model()
    extend_instance_class(model, FlatPackedRows)
    model.pg_collection = types.SimpleNamespace(
        tp=types.SimpleNamespace(size=lambda: 1), cp=types.SimpleNamespace(size=lambda: 1)
    )
    model.pre_process = False
    rows = {
        "input_ids": torch.zeros(2, 8, dtype=torch.long),
        "position_ids": torch.zeros(3, 2, 8, dtype=torch.long),
        "packed_seq_params": object(),
        "attention_mask": torch.ones(2, 8, dtype=torch.bool),
    }
    checked = []
    pending = types.SimpleNamespace(model=model, attention_mask=rows["attention_mask"])
    pending.require_unpadded_rows = lambda: checked.append(True)
    with open_micro_batch() as micro_batch:
        micro_batch.pending_positions = types.SimpleNamespace(model=_Model(), attention_mask=rows["attention_mask"])
        assert model(**rows)["input_ids"].shape == (2, 8)  # another model's: left to Bridge
        micro_batch.pending_positions = pending
        assert model(**rows)["input_ids"].shape == (1, 16) and checked == [True]
    assert model(**rows)["input_ids"].shape == (2, 8)  # outside a micro-batch: none pending


def test_one_mixin_taken_off_alone_keeps_the_others_and_their_counts():
    model = _Model()
    record = forward_host.ForwardInstall(pairs=[(model, FlatPackedRows), (model, BoundGrids)])
    for obj, mixin in record.pairs:
        extend_instance_class(obj, mixin)
        attach_counts(obj, record.counts)
    fired = []
    handle = model.register_forward_hook(lambda *args: fired.append(True))
    record.hooks.append((model, BoundGrids, handle))
    with pytest.raises(ValueError, match="RowMerge"):
        forward_host.uninstall(record, ["BoundGrids", "RowMerge"])
    assert isinstance(model, BoundGrids)  # a refused call takes nothing off
    forward_host.uninstall(record, ["BoundGrids"])
    assert not isinstance(model, BoundGrids) and isinstance(model, FlatPackedRows)
    model(input_ids=torch.zeros(1, 2))
    assert record.pairs == [(model, FlatPackedRows)] and record.hooks == [] and fired == []  # the hook went with it
    assert counts_of(model) is record.counts  # FlatPackedRows still counts
    forward_host.uninstall(record)
    assert type(model) is _Model and counts_of(model) is None and record.pairs == []
    forward_host.uninstall(record)  # idempotent
    assert set(forward_host.MIXINS) >= {"BoundGrids", "FlatPackedRows", "RowMerge", "CpuRopeIndex"}
