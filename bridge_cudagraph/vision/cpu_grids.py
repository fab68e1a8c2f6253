"""The micro-batch's image and video grids on the CPU, as the collate made them, for the forward that reads them.

Why: the graphed vision encoder needs the grid's integers on the CPU before it can replay (the patches per frame
pick the budget; the positions are derived from them), and Bridge's Qwen3-VL step has moved the grid to the GPU by
then. Reading it back (``grid_thw.cpu()``) makes the CPU wait until the GPU has run everything queued before the
copy: at every micro-batch after a step's first, the whole backward of the one before. The queue the graphs keep full
is drained, and the GPU then idles while the CPU sets up the vision replay, derives the mRoPE positions and sets up
the language replay. The collated batch held the same integers on the CPU before the step moved them.

How, in three places with one owner each, all through the step's :class:`~bridge_cudagraph.micro_batch.MicroBatch`:

* whoever holds the collated batch puts its grids in the micro-batch its forward step opened (:func:`from_collated`
  into :attr:`~bridge_cudagraph.micro_batch.MicroBatch.cpu_grids`: Bridge's loop through
  :func:`bridge_cudagraph.bridge.data_path.observing_forward_step` and :func:`record_collated`; the benchmark and the
  GPU tests through :func:`~bridge_cudagraph.micro_batch.open_micro_batch` around their own forward step,
  :mod:`bridge_cudagraph.testing.parity`);
* Qwen3-VL's forward binds each grid to the device tensor that call received
  (:class:`~bridge_cudagraph.host.bound_grids.BoundGrids`, ``model.cuda_graph.forward.collated_grids``:
  :func:`bind`), where the shapes agree, and enqueues a device-side check that both hold the same values (no wait; a
  mismatch stops the run at the check); the binding ends with that forward;
* the encoder's replay asks for the CPU copy of the very tensor it is handed
  (:meth:`~bridge_cudagraph.micro_batch.MicroBatch.cpu_copy`). By identity: a grid Bridge's forward built anew
  (images and videos together, or split for context parallelism) has no CPU copy and is read back as before.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch

from bridge_cudagraph.micro_batch import CpuGrids, MicroBatch, current_micro_batch

__all__ = ["GRID_KEYS", "bind", "from_collated", "record_collated"]

#: The model's keyword arguments that carry a grid (``GenericVisualInputs.normalized_for_model``'s names).
GRID_KEYS = ("image_grid_thw", "video_grid_thw")


def from_collated(batch: Any) -> CpuGrids | None:
    """The grids of a collated Qwen3-VL micro-batch (Bridge's VLM collate: ``batch["visual_inputs"]``), normalised as
    Bridge's ``get_batch`` normalises them, while they are still on the CPU; None where there are none there.

    A shallow copy is normalised: Bridge's ``get_batch`` then replaces the batch's own tensors by device copies in
    place, which leaves these CPU tensors as they are."""
    visual = batch.get("visual_inputs") if isinstance(batch, Mapping) else None
    if visual is None or not hasattr(visual, "normalized_for_model"):
        return None
    tensors = copy.copy(visual).normalized_for_model()
    grids = {
        key: tensors[key]
        for key in GRID_KEYS
        if isinstance(tensors.get(key), torch.Tensor) and tensors[key].device.type == "cpu"
    }
    return CpuGrids(grids) if grids else None


def record_collated(batch: Any) -> None:
    """Put the grids of a collated micro-batch just drawn into the current micro-batch (an observer of the step's
    data iterator); nothing outside a micro-batch."""
    micro_batch = current_micro_batch()
    if micro_batch is not None:
        micro_batch.cpu_grids = from_collated(batch)


def bind(micro_batch: MicroBatch, kwargs: Mapping[str, Any]) -> int:
    """Bind each of ``micro_batch``'s CPU grids to the device tensor of the same name in ``kwargs`` (a Qwen3-VL
    forward's keyword arguments) where their shapes agree, enqueueing a device-side check of their values; returns how
    many were bound (:attr:`~bridge_cudagraph.micro_batch.MicroBatch.bound_grids`, replaced)."""
    pairs = []
    grids = micro_batch.cpu_grids.grids if micro_batch.cpu_grids is not None else {}
    for key, cpu in grids.items():
        device = kwargs.get(key)
        if not isinstance(device, torch.Tensor) or device.shape != cpu.shape:
            continue
        # From pageable memory the copy is staged before this returns; from pinned memory (a loader that pins) torch's
        # host allocator keeps the block until the copy has run. Either way nothing waits for the GPU here.
        same = device == cpu.to(device.device, dtype=device.dtype, non_blocking=True)
        torch._assert_async(same.all(), "bridge_cudagraph: the collate's CPU grid differs from the model's input")
        pairs.append((device, cpu))
    micro_batch.bound_grids = tuple(pairs)
    return len(pairs)
