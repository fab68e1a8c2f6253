"""What stops a capture before any graph is built: the error it raises, and the check of the capture's static inputs
against the plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["CaptureError", "check_static_inputs"]


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
