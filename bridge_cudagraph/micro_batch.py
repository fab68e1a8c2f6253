"""One micro-batch's state, from the forward step that draws it to the end of that step: :class:`MicroBatch`.

Contract:

* **Who creates it.** The forward step, around its whole body: Bridge's loop through
  :func:`bridge_cudagraph.bridge.data_path.observing_forward_step`, the parity and benchmark steps through
  :func:`bridge_cudagraph.testing.parity.per_token_loss` and its forward step. Each opens it with
  :func:`open_micro_batch`, which ends it when the block leaves, also on an exception: every field is cleared and
  the accessor answers None again.
* **Who writes it.** Whoever draws the collated batch sets :attr:`MicroBatch.cpu_grids`
  (:mod:`bridge_cudagraph.vision.cpu_grids`); the Qwen3-VL forward's host changes set the other fields for the length
  of one model forward and clear them when it returns (:mod:`bridge_cudagraph.host.bound_grids`,
  :mod:`bridge_cudagraph.host.rope_index`).
* **Who reads it.** The host changes, the vision encoder's replay and the packed language replay, each through the
  one accessor :func:`current_micro_batch`. None outside a micro-batch: a reader then takes the path it takes without
  one (reads a grid back from the device, packs rows as wide as they come).
* **Nesting.** :func:`open_micro_batch` inside an open micro-batch raises: one forward step draws one micro-batch.
  A model forward that runs outside any forward step (a test calling the model itself) opens one of its own for the
  length of that forward (:func:`within_micro_batch`), so the host changes behave the same either way; inside a
  forward step it joins the step's.
* **A reference kept past the end** reads an empty micro-batch: :attr:`MicroBatch.open` is False and every field is
  cleared, so nothing of one micro-batch reaches the next.

Why a context variable: the readers sit inside host forwards whose signatures are fixed (Bridge's
``Qwen3VLModel.forward``, megatron-core's ``TransformerBlock.forward``, Bridge's vision encoder), so the micro-batch
cannot be passed to them as an argument. Module globals and attributes set on host modules did this before; they
outlive the step on an exception unless every writer cleans up, and they let two owners write the same slot. One
:class:`contextvars.ContextVar` holds the one object per micro-batch, set and reset by one context manager (the shape
of vLLM's ``set_forward_context`` / ``get_forward_context``). A context variable is per thread: the forward runs on
the thread that calls the step, and nothing here is read in the backward (autograd's threads see None).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["CpuGrids", "MicroBatch", "current_micro_batch", "open_micro_batch", "row_extents", "within_micro_batch"]


@dataclass(frozen=True)
class CpuGrids:
    """One micro-batch's image and video grids on the CPU, keyed as the model's keyword arguments
    (:data:`bridge_cudagraph.vision.cpu_grids.GRID_KEYS`), in the shape Bridge's step hands them to the model
    (:func:`bridge_cudagraph.vision.cpu_grids.from_collated` makes them)."""

    grids: Mapping[str, torch.Tensor]


@dataclass(eq=False)
class MicroBatch:
    """What one micro-batch's readers share (see the module docstring for who writes and reads each field)."""

    cpu_grids: CpuGrids | None = None
    """The collate's image and video grids on the CPU, as the model's keyword arguments name them; None: none
    drawn (a text-only batch, a forward step that holds none)."""
    bound_grids: tuple[tuple[torch.Tensor, torch.Tensor], ...] = ()
    """``(device tensor, CPU copy)`` for each grid the running model forward received and :attr:`cpu_grids` holds
    (:func:`bridge_cudagraph.vision.cpu_grids.bind`); empty outside that forward."""
    row_extents: tuple[Any, tuple[int, ...]] | None = None
    """``(packed_seq_params, extents)``: the rows' extents for tight packing (:func:`row_extents_for`) of the running
    model forward, keyed by the very ``packed_seq_params`` object that forward built."""
    pending_positions: Any = None
    """The running Qwen3-VL forward's mRoPE positions not yet filled
    (:class:`~bridge_cudagraph.host.rope_index.PendingPositions`), until its input embedding takes them."""
    open: bool = True
    """False once the micro-batch has ended (its fields are cleared then)."""

    def row_extents_for(self, packed_seq_params: Any) -> tuple[int, ...] | None:
        """The rows' extents set for this very ``packed_seq_params`` object, or None (another forward's, or none)."""
        if self.row_extents is None or self.row_extents[0] is not packed_seq_params:
            return None
        return self.row_extents[1]

    def cpu_copy(self, device: torch.Tensor) -> torch.Tensor | None:
        """The CPU copy bound to this very device tensor (:attr:`bound_grids`), or None: read it back."""
        for bound, cpu in self.bound_grids:
            if bound is device:
                return cpu
        return None

    def close(self) -> None:
        """End the micro-batch: every field cleared, :attr:`open` False."""
        self.cpu_grids = None
        self.bound_grids = ()
        self.row_extents = None
        self.pending_positions = None
        self.open = False


def row_extents(
    loss_mask: torch.Tensor, input_ids: torch.Tensor, visual_ids: Sequence[int] = ()
) -> tuple[int, ...] | None:
    """The rows' extents :attr:`MicroBatch.row_extents` holds, for tight packing
    (:mod:`bridge_cudagraph.capture.tight`): per row of ``input_ids`` (``[B, L]``, on the CPU), one past its last
    token that carries loss (``loss_mask``, on the CPU, ``[B, L]`` or ``[1, B x L]``) or is one of ``visual_ids``; at
    least 1. None when the shapes disagree."""
    if input_ids.dim() != 2 or loss_mask.numel() != input_ids.numel():
        return None
    rows, width = input_ids.shape
    keep = loss_mask.reshape(rows, width) != 0
    for token in visual_ids:
        keep |= input_ids == int(token)
    # The last True per row: argmax of position x keep (0 where a row keeps nothing).
    positions = torch.arange(1, width + 1).expand(rows, width)
    last = torch.where(keep, positions, torch.zeros_like(positions)).amax(dim=1)
    return tuple(max(1, int(x)) for x in last.tolist())


_CURRENT: contextvars.ContextVar[MicroBatch | None] = contextvars.ContextVar(
    "bridge_cudagraph_micro_batch", default=None
)


def current_micro_batch() -> MicroBatch | None:
    """The micro-batch whose forward step is running on this thread, or None outside one."""
    return _CURRENT.get()


@contextlib.contextmanager
def open_micro_batch(cpu_grids: CpuGrids | None = None) -> Iterator[MicroBatch]:
    """A new :class:`MicroBatch` (with ``cpu_grids``, or set later by whoever draws the batch), current while the
    block runs and closed when it leaves, also on an exception. Raises inside another: one step, one micro-batch."""
    if _CURRENT.get() is not None:
        raise RuntimeError(
            "bridge_cudagraph: a micro-batch was opened inside another; each forward step opens one for the "
            "micro-batch it draws"
        )
    micro_batch = MicroBatch(cpu_grids=cpu_grids)
    token = _CURRENT.set(micro_batch)
    try:
        yield micro_batch
    finally:
        _CURRENT.reset(token)
        micro_batch.close()


@contextlib.contextmanager
def within_micro_batch() -> Iterator[MicroBatch]:
    """The current micro-batch for a model forward, or one of its own for the block where no forward step opened one
    (closed when the block leaves)."""
    micro_batch = _CURRENT.get()
    if micro_batch is not None:
        yield micro_batch
        return
    with open_micro_batch() as own:
        yield own
