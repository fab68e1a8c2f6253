"""Qwen3-VL's forward with fewer host waits: what ``model.cuda_graph.forward`` switches, one setting per part
(:data:`MECHANISMS`; null: on wherever graphs are on a Qwen3-VL model), put on and taken off here (:func:`install`,
:func:`uninstall`).

Host change:
  changes: the class of one ``Qwen3VLModel`` and its decoder (mixins in front,
    :func:`~bridge_cudagraph.host.instance_class.extend_instance_class`), a forward pre-hook on its input embedding
    and a forward hook on its encoder, a reference to the install's counts in the model's instance dict; mirrors
    parts of Bridge's Qwen3-VL forward: the mechanisms are in :mod:`~bridge_cudagraph.host.rope_index`,
    :mod:`~bridge_cudagraph.host.row_merge`, :mod:`~bridge_cudagraph.host.flat_rows`,
    :mod:`~bridge_cudagraph.host.bound_grids` and :mod:`~bridge_cudagraph.host.forward_counts`
  written for: Megatron-Bridge 0.6.2 ``Qwen3VLModel.forward``, ``get_rope_index``, ``_deepstack_process``,
    ``preprocess_packed_seqs``
  gate: the proven stack (:func:`~bridge_cudagraph.host.compat.check_proven_stack`);
    :func:`~bridge_cudagraph.host.compat.qwen3_vl_forward_is_mirrored`; ``model.cuda_graph.forward``, part by part
  undo: :func:`uninstall`

What each mixin takes off, in one line each (the reasoning, and what was measured, is in
``docs/design/host-waits.md``); every one computes the same values, bitwise, as Bridge's forward:

* :class:`~bridge_cudagraph.host.rope_index.CpuRopeIndex`: the mRoPE positions from Bridge's own ``get_rope_index``
  on CPU copies of the tokens and grids, enqueued at the forward's start and filled before the input embedding runs;
  where the packed replay packs rows tightly, the rows' extents for it from the same copies;
* :class:`~bridge_cudagraph.host.row_merge.IndexedDeepstack`: the deepstack merges by row positions
  (``nonzero_static``, the count asserted on the device) instead of a boolean mask;
* :class:`~bridge_cudagraph.host.row_merge.RowMerge`: the image-token merge by positions, the same ``index_put_``;
* :class:`~bridge_cudagraph.host.flat_rows.FlatPackedRows`: the step's packed rows handed to the forward flat where
  Bridge's own packing would give exactly that (every token kept, context parallelism off); a mask that drops tokens
  raises;
* :class:`~bridge_cudagraph.host.bound_grids.BoundGrids`: the collate's CPU grids
  (:mod:`bridge_cudagraph.vision.cpu_grids`) bound to the device tensors this call received, checked on the device.

Per-micro-batch state (the pending positions, the rows' extents, the bound grids) lives in the forward step's
:class:`~bridge_cudagraph.micro_batch.MicroBatch`; per-install state (the pairs, the hooks' handles, the counts) in
the :class:`ForwardInstall` that :func:`install` returns to whoever installs (:mod:`bridge_cudagraph.host.step`, for
the callback and the benchmark). They mirror Bridge 0.6's forward; on another release nothing is installed.
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from bridge_cudagraph.host import compat
from bridge_cudagraph.host.bound_grids import BoundGrids
from bridge_cudagraph.host.flat_rows import FlatPackedRows
from bridge_cudagraph.host.forward_counts import ForwardCounts, attach_counts, counts_of, detach_counts
from bridge_cudagraph.host.instance_class import extend_instance_class, restore_instance_class
from bridge_cudagraph.host.rope_index import CpuRopeIndex, fill_at_embedding, fills_at_embedding
from bridge_cudagraph.host.row_merge import IndexedDeepstack, RowMerge, vision_rows_hook

__all__ = ["MECHANISMS", "MIXINS", "ForwardInstall", "counts", "counts_in", "install", "installed", "uninstall"]

logger = logging.getLogger(__name__)

#: Each part of ``model.cuda_graph.forward`` (:data:`bridge_cudagraph.config.FORWARD_PARTS`): the mixins
#: :func:`install` puts on for it.
MECHANISMS: Mapping[str, tuple[type, ...]] = MappingProxyType(
    {
        "positions": (CpuRopeIndex,),
        "merges": (IndexedDeepstack, RowMerge),
        "flat_rows": (FlatPackedRows,),
        "collated_grids": (BoundGrids,),
    }
)

#: The mixins :func:`install` puts on, by name (the names a benchmark lever takes off alone, :func:`uninstall`).
MIXINS: Mapping[str, type] = MappingProxyType(
    {mixin.__name__: mixin for mixins in MECHANISMS.values() for mixin in mixins}
)


@dataclass
class ForwardInstall:
    """What :func:`install` put on, for :func:`uninstall`, and what it did since (:func:`counts`).

    Attributes:
        pairs: ``(object, mixin)`` for every mixin on an object.
        hooks: ``(object, mixin, handle)`` for every hook a mixin came with.
        counts: What the mixins did (kept after :func:`uninstall`).
    """

    pairs: list[tuple[Any, type]] = field(default_factory=list)
    hooks: list[tuple[Any, type, Any]] = field(default_factory=list)
    counts: ForwardCounts = field(default_factory=ForwardCounts)


def _targets(model_chunks: list[Any]) -> list[tuple[Any, type]]:
    """``(object, mixin)`` for every Bridge ``Qwen3VLModel`` in ``model_chunks`` and its language decoder."""
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.model import Qwen3VLModel
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.transformer_block import Qwen3VLTransformerBlock

    out: list[tuple[Any, type]] = []
    for chunk in model_chunks:
        for module in chunk.modules():
            if isinstance(module, Qwen3VLModel):
                # Installed in this order: CpuRopeIndex in front of FlatPackedRows, so the positions are derived
                # from the rows; BoundGrids in front of both, so the positions read the bound grids.
                out.append((module, FlatPackedRows))
                out.append((module, CpuRopeIndex))
                out.append((module, BoundGrids))
                if getattr(module, "pre_process", False) and getattr(module, "vision_model", None) is not None:
                    out.append((module, RowMerge))
                decoder = getattr(module.language_model, "decoder", None)
                if isinstance(decoder, Qwen3VLTransformerBlock):
                    out.append((decoder, IndexedDeepstack))
    return out


def install(model_chunks: list[Any], mechanisms: Iterable[str] = tuple(MECHANISMS)) -> ForwardInstall:
    """Put the mixins of ``mechanisms`` (:data:`MECHANISMS`) on the Qwen3-VL models in ``model_chunks``; returns what
    :func:`uninstall` takes off (nothing for other models, and where the installed Bridge is not the release they
    mirror, logged once)."""
    record = ForwardInstall()
    if not compat.qwen3_vl_forward_is_mirrored():
        logger.warning(
            "bridge_cudagraph: model.cuda_graph.forward is off: it mirrors Megatron-Bridge %s's Qwen3-VL forward "
            "(installed: %s)",
            compat.QWEN3_VL_FORWARD_MIRRORS,
            compat.installed_version("megatron-bridge"),
        )
        return record
    wanted = {mixin for name in mechanisms for mixin in MECHANISMS[name]}
    record.pairs = [(obj, mixin) for obj, mixin in _targets(model_chunks) if mixin in wanted]
    for obj, mixin in record.pairs:
        extend_instance_class(obj, mixin)
        if mixin is not IndexedDeepstack:
            attach_counts(obj, record.counts)
        if mixin is CpuRopeIndex and fills_at_embedding(obj):
            embedding = obj.language_model.embedding
            record.hooks.append((obj, mixin, embedding.register_forward_pre_hook(fill_at_embedding(weakref.ref(obj)))))
        if mixin is RowMerge:
            hook = vision_rows_hook(weakref.ref(obj), record.counts)
            record.hooks.append((obj, mixin, obj.vision_model.register_forward_hook(hook)))
    return record


def uninstall(record: ForwardInstall, names: Collection[str] | None = None) -> None:
    """Undo :func:`install` (idempotent): the host classes back, the hooks removed, the counts' references dropped;
    with ``names`` only those mixins (:data:`MIXINS`; the benchmark takes one off alone), each of which must be on."""
    chosen = record.pairs if names is None else [pair for pair in record.pairs if pair[1].__name__ in names]
    if names is not None and {mixin.__name__ for _, mixin in chosen} != set(names):
        missing = sorted(set(names) - {mixin.__name__ for _, mixin in chosen})
        raise ValueError(f"bridge_cudagraph: model.cuda_graph.forward did not install {missing} to take off")
    taken = {(id(obj), mixin) for obj, mixin in chosen}
    for obj, mixin in chosen:
        restore_instance_class(obj, mixin)
    for obj, mixin, handle in record.hooks:
        if (id(obj), mixin) in taken:
            handle.remove()
    record.hooks = [entry for entry in record.hooks if (id(entry[0]), entry[1]) not in taken]
    record.pairs = [pair for pair in record.pairs if (id(pair[0]), pair[1]) not in taken]
    left = {id(obj) for obj, _ in record.pairs}
    for obj, _ in chosen:
        if id(obj) not in left:
            detach_counts(obj)


def counts(record: ForwardInstall) -> dict[str, int]:
    """What the mixins of ``record`` did so far: ``cpu_positions_calls``, ``row_merges``, ``flat_batches``,
    ``grid_binds``."""
    return dataclasses.asdict(record.counts)


def counts_in(model_chunks: list[Any]) -> dict[str, int]:
    """:func:`counts` summed over the installs whose mixins are on the Qwen3-VL models in ``model_chunks`` (zeros
    once :func:`uninstall` took them off)."""
    found = {id(c): c for c in (counts_of(obj) for obj, _ in _targets(model_chunks)) if c is not None}
    total = ForwardCounts()
    for each in found.values():
        for name, value in dataclasses.asdict(each).items():
            setattr(total, name, getattr(total, name) + value)
    return dataclasses.asdict(total)


def installed(model_chunks: list[Any]) -> bool:
    """Whether :func:`install` has put a mixin on some object inside ``model_chunks``."""
    return any(isinstance(obj, mixin) for obj, mixin in _targets(model_chunks))
