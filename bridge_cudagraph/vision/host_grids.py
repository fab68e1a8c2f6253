"""The micro-batch's image and video grids on the host, as the collate made them, for the forward that reads them.

Why: the graphed vision encoder needs the grid's integers on the host before it can replay (the patches per frame
pick the budget; the positions are derived from them), and Bridge's Qwen3-VL step has moved the grid to the GPU by
then. Reading it back (``grid_thw.cpu()``) makes the host wait until the GPU has run everything queued before the
copy: at every micro-batch after a step's first, the whole backward of the one before. The queue the graphs keep full
is drained, and the GPU then idles while the host sets up the vision replay, derives the mRoPE positions and sets up
the language replay. The collated batch held the same integers on the host before the step moved them.

How, in three places with one owner each:

* whoever holds the collated batch publishes its grids while the forward step that draws it runs
  (:func:`publish_collated` and :func:`clear`: Bridge's loop through
  :func:`bridge_cudagraph.bridge.data_path.observing_forward_step`; the benchmark and the GPU tests through
  :func:`published` around their own forward step, :mod:`bridge_cudagraph.testing.parity`);
* Qwen3-VL's forward binds each published grid to the device tensor that call received
  (:class:`~bridge_cudagraph.host.forward.BoundGrids`, ``model.cuda_graph.forward.collated_grids``: :func:`bind` and
  :func:`unbind`), where the shapes agree, and enqueues a device-side check that both hold the same values (no
  wait; a mismatch stops the run at the check);
* the encoder asks for the host copy of the very tensor it is handed (:func:`host_copy`). By identity: a grid Bridge's
  forward built anew (images and videos together, or split for context parallelism) has no host copy and is read
  back as before.

The state is the process's (one forward runs at a time on the thread that draws the batch); :func:`clear` and
:func:`unbind` end it, so a grid is never used outside the step and the forward it belongs to.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "GRID_KEYS",
    "HostGrids",
    "bind",
    "clear",
    "from_collated",
    "host_copy",
    "publish",
    "publish_collated",
    "published",
    "unbind",
]

#: The model's keyword arguments that carry a grid (``GenericVisualInputs.normalized_for_model``'s names).
GRID_KEYS = ("image_grid_thw", "video_grid_thw")


@dataclass(frozen=True)
class HostGrids:
    """One micro-batch's grids on the host, keyed as the model's keyword arguments (:data:`GRID_KEYS`), in the shape
    Bridge's step hands them to the model."""

    grids: Mapping[str, torch.Tensor]


_published: HostGrids | None = None
#: ``(device tensor, host copy)`` for the forward running now (:func:`bind`).
_bound: tuple[tuple[torch.Tensor, torch.Tensor], ...] = ()


def from_collated(batch: Any) -> HostGrids | None:
    """The grids of a collated Qwen3-VL micro-batch (Bridge's VLM collate: ``batch["visual_inputs"]``), normalised as
    Bridge's ``get_batch`` normalises them, while they are still on the host; None where there are none there.

    A shallow copy is normalised: Bridge's ``get_batch`` then replaces the batch's own tensors by device copies in
    place, which leaves these host tensors as they are."""
    visual = batch.get("visual_inputs") if isinstance(batch, Mapping) else None
    if visual is None or not hasattr(visual, "normalized_for_model"):
        return None
    tensors = copy.copy(visual).normalized_for_model()
    grids = {
        key: tensors[key]
        for key in GRID_KEYS
        if isinstance(tensors.get(key), torch.Tensor) and tensors[key].device.type == "cpu"
    }
    return HostGrids(grids) if grids else None


def publish(grids: HostGrids | None) -> None:
    """Make ``grids`` the published ones (None: none), until :func:`clear`."""
    global _published
    _published = grids


def publish_collated(batch: Any) -> None:
    """:func:`publish` the grids of a collated micro-batch just drawn (an observer of the step's data iterator)."""
    publish(from_collated(batch))


def clear() -> None:
    """No grids published or bound (the forward step has returned)."""
    global _bound
    publish(None)
    _bound = ()


@contextlib.contextmanager
def published(grids: HostGrids | None) -> Iterator[None]:
    """``grids`` published while the block runs (a forward step that holds its micro-batch's host grids)."""
    publish(grids)
    try:
        yield
    finally:
        clear()


def bind(kwargs: Mapping[str, Any]) -> int:
    """Bind each published grid to the device tensor of the same name in ``kwargs`` (a Qwen3-VL forward's keyword
    arguments) where their shapes agree, enqueueing a device-side check of their values; returns how many were
    bound."""
    global _bound
    if _published is None:
        return 0
    pairs = []
    for key, host in _published.grids.items():
        device = kwargs.get(key)
        if not isinstance(device, torch.Tensor) or device.shape != host.shape:
            continue
        # From pageable memory the copy is staged before this returns; from pinned memory (a loader that pins) torch's
        # host allocator keeps the block until the copy has run. Either way nothing waits for the GPU here.
        same = device == host.to(device.device, dtype=device.dtype, non_blocking=True)
        torch._assert_async(same.all(), "bridge_cudagraph: the published host grid differs from the model's input")
        pairs.append((device, host))
    _bound = tuple(pairs)
    return len(pairs)


def unbind() -> None:
    """Drop what :func:`bind` bound (the forward has returned)."""
    global _bound
    _bound = ()


def host_copy(device: torch.Tensor) -> torch.Tensor | None:
    """The bound host copy of this very tensor, or None (not bound: read it back)."""
    for bound, host in _bound:
        if bound is device:
            return host
    return None
