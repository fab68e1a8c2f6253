"""What stops a capture before any graph is built: the error it raises, and the checks of the capture's static inputs
against the plan and of the process groups against the model config."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["CaptureError", "check_group_sizes", "check_static_inputs"]


class CaptureError(RuntimeError):
    """A configuration that cannot be captured as asked, found before any graph is built."""


def check_static_inputs(tensors: Mapping[str, Any], planned: Sequence[Any], submodule: str) -> None:
    """The buffers capture is about to use must be the plan's static inputs
    (:class:`~bridge_cudagraph.plan.capture_plan.StaticInput`).

    The plan is what ``bridge-cudagraph plan`` printed and what memory was budgeted for; a buffer of another shape
    or dtype means the plan and the model disagree, and capture stops with both instead of replaying something
    else. Inputs the plan lists but the layer does not take (``tensors`` lacks them) are not checked here.
    """
    for want in planned:
        tensor = tensors.get(want.name)
        if tensor is None:
            continue
        dtype = getattr(torch, want.torch_dtype_name)
        if tuple(tensor.shape) != tuple(want.shape) or tensor.dtype != dtype:
            raise CaptureError(
                f"{submodule}: static input {want.name} is {tuple(tensor.shape)} {tensor.dtype} but the capture plan "
                f"says {want.describe()}; the plan and the model disagree (build the plan from the finalized config)"
            )


def check_group_sizes(config, pg_collection, submodule: str) -> None:
    """Static capture shapes come from ``config.*_parallel_size``; the kernels run on the collection's groups.

    When the two disagree the captured buffers have the wrong shape and replay fails with a shape error
    deep inside TE, or - worse - broadcasts. Say so before capture.
    """
    pairs = [
        ("tensor_model_parallel_size", pg_collection.tp),
        ("context_parallel_size", pg_collection.cp),
        ("pipeline_model_parallel_size", pg_collection.pp),
    ]
    for attr, group in pairs:
        want = int(getattr(config, attr, 1) or 1)
        have = group.size() if group is not None else 1
        if want != have:
            raise CaptureError(
                f"{submodule}: config.{attr} = {want} but its process-group collection has a group of size {have}; "
                f"build the {submodule} groups from the same layout as the model config "
                "(bridge_cudagraph.parallel.groups.build_collections) or set the config to match"
            )
    if pg_collection.dp_cp is None:
        raise CaptureError(
            f"{submodule}: the process-group collection has no dp_cp group; Megatron-Core's helper logs on it and "
            "raises without it. Build the collection with bridge_cudagraph.parallel.groups, which sets every field"
        )
