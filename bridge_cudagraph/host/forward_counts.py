"""What ``model.cuda_graph.forward`` did, counted per install (:class:`ForwardCounts`), and how a mixin finds its
install's.

Host change:
  changes: one instance attribute of each Bridge ``Qwen3VLModel`` :mod:`~bridge_cudagraph.host.forward` puts a mixin
    on: a reference to its install's :class:`ForwardCounts` (:func:`attach_counts`), nothing the host saves or reads
  written for: Megatron-Bridge 0.6.2 ``Qwen3VLModel``
  gate: as :mod:`~bridge_cudagraph.host.forward`
  undo: :func:`detach_counts`, by :func:`~bridge_cudagraph.host.forward.uninstall`

The counts belong to the install record (:class:`~bridge_cudagraph.host.forward.ForwardInstall`) that whoever
installs owns; the model holds only the reference its mixins' forwards read (their signatures are the host's, so the
record cannot be handed to them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ForwardCounts", "attach_counts", "counts_of", "detach_counts"]

#: The instance-dict key of the reference.
_COUNTS = "_bridge_cudagraph_forward_counts"


@dataclass
class ForwardCounts:
    """Micro-batches that took each part of ``model.cuda_graph.forward`` since its install; what the tests assert is
    > 0."""

    cpu_positions_calls: int = 0
    """Forwards whose mRoPE positions came from the CPU copy
    (:class:`~bridge_cudagraph.host.rope_index.CpuRopeIndex`)."""
    row_merges: int = 0
    """Image-token merges written by row positions (:class:`~bridge_cudagraph.host.row_merge.RowMerge`)."""
    flat_batches: int = 0
    """Micro-batches handed to Bridge's forward flat (:class:`~bridge_cudagraph.host.flat_rows.FlatPackedRows`)."""
    grid_binds: int = 0
    """Forwards that read their grids from the collate's CPU copies
    (:class:`~bridge_cudagraph.host.bound_grids.BoundGrids`)."""


def attach_counts(obj: Any, counts: ForwardCounts) -> None:
    """Let ``obj``'s mixins count into ``counts``."""
    obj.__dict__[_COUNTS] = counts


def detach_counts(obj: Any) -> None:
    """Undo :func:`attach_counts`."""
    obj.__dict__.pop(_COUNTS, None)


def counts_of(obj: Any) -> ForwardCounts | None:
    """The counts ``obj``'s mixins count into, or None (not installed)."""
    return getattr(obj, "__dict__", {}).get(_COUNTS)
