"""Real process groups for the language model and the vision encoder, without ``parallel_state``.

Each submodule gets its own ``ProcessGroupCollection`` built from two megatron-core ``HyperCommGrid``s (dense and
expert), laid out exactly as :mod:`bridge_cudagraph.parallel.layout` enumerates them, and the two are wrapped in a
``MultiModuleProcessGroupCollection``. Nothing here reads or writes the globals of
``megatron.core.parallel_state``: the collections are the only record of the groups ("M4").

Collective contract:
    Creating a group (``HyperCommGrid.create_pg``, ``torch.distributed.new_subgroups_by_enumeration``) calls
    ``torch.distributed.new_group`` once per subgroup, and ``new_group`` is collective over the *whole world*: every
    rank must call every builder in this module, in the same order, with the same layouts, including ranks that are
    outside the grid being built (they get ``None`` back). Layouts are therefore validated before the first group is
    created, on every rank alike, so a bad layout raises everywhere instead of leaving some ranks blocked in a
    collective.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from megatron.core.hyper_comm_grid import HyperCommGrid
from megatron.core.process_groups_config import MultiModuleProcessGroupCollection, ProcessGroupCollection

from bridge_cudagraph.parallel.layout import (
    DENSE_DIM_NAMES,
    EXPERT_DIM_NAMES,
    GROUP_DIMS,
    LayoutError,
    ParallelLayout,
    ResolvedLayout,
    Submodule,
    VisionLayout,
    rank_layout,
    resolve_submodules,
)

__all__ = [
    "build_collections",
    "build_submodule_collection",
    "derive_vision_collection",
    "destroy_collections",
    "layout_of_collection",
]

# Attribute under which a collection keeps what ``destroy_collections`` must tear down. A private attribute on the
# instance because ``ProcessGroupCollection`` is an unhashable dataclass (no weak-keyed side table) and its
# ``__init__`` only accepts declared fields.
_OWNED_ATTR = "_bridge_cudagraph_owned"


@dataclasses.dataclass(slots=True)
class _Owned:
    """The grids and loose groups a collection was built from; destroyed together at teardown."""

    grids: list[HyperCommGrid]
    loose_groups: list[dist.ProcessGroup]


def _require_world(layout: ResolvedLayout) -> int:
    """Check ``torch.distributed`` is up and its world matches the layout; returns this rank."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("torch.distributed must be initialized before building process groups")
    world = dist.get_world_size()
    if world != layout.world_size:
        raise LayoutError(
            f"{layout.name} layout was resolved for world size {layout.world_size}, but torch.distributed has "
            f"{world} ranks (resolve the layout with the actual world size)"
        )
    return dist.get_rank()


def build_submodule_collection(
    layout: ResolvedLayout,
    *,
    name: Submodule | str | None = None,
    rank_offset: int | None = None,
    backend: str | None = None,
    timeout: timedelta | None = None,
) -> ProcessGroupCollection | None:
    """Create every process group of one submodule and return them as a ``ProcessGroupCollection``.

    Mirrors Megatron-Bridge's ``_create_pg_collection`` (dense grid ``[tp, cp, dp, pp]``, expert grid
    ``[etp, ep, expt_dp, pp]``, embedding groups from the pipeline groups) and also fills the fields that
    Bridge leaves unset but consumers read, so that nothing falls back to ``parallel_state``:

    * ``dp_cp_gtp_remat = dp_cp``, ``expt_dp_gtp_remat = expt_dp``, ``tp_ep_pp_with_egtp_remat = tp_ep_pp``
      (identical groups without GTP; MoE metric logging and finalize_model_grads read the first);
    * ``intra_dist_opt``: every rank of the grid, which is the group ``parallel_state`` builds for one optimizer
      instance (the concatenation of all tp-ep-pp groups of the instance). Bridge leaves it ``None``, which the
      distributed optimizer then uses as the *world* group for grad-norm reductions: right for a language grid
      that spans the world, wrong for a grid that does not;
    * ``intra_dp_cp = dp_cp`` and ``intra_expt_dp = expt_dp`` (one optimizer instance), ``inter_dist_opt = None``;
    * ``tp_dp``, which ``TECudaGraphHelper._get_amax_reduction_group`` reads for FP8 without context parallelism
      but which is not a declared field (see below).

    This call is collective over the whole world (see the module docstring): ranks outside the grid must call it
    too, and get ``None``.

    Args:
        layout: The resolved layout to build.
        name: Overrides ``layout.name`` (used in group descriptions).
        rank_offset: Overrides ``layout.rank_offset``.
        backend: Backend of every group; ``None`` means the default group's backend.
        timeout: Timeout of every group; ``None`` means the default.

    Returns:
        The collection on ranks inside the grid, ``None`` elsewhere.

    Raises:
        RuntimeError: ``torch.distributed`` is not initialized.
        LayoutError: The layout does not fit the actual world size.
    """
    changes: dict[str, Any] = {}
    if name is not None:
        changes["name"] = Submodule(name)
    if rank_offset is not None:
        changes["rank_offset"] = rank_offset
    if changes:
        layout = dataclasses.replace(layout, **changes)  # re-runs the layout's own validation
    rank = _require_world(layout)
    ranks = rank_layout(layout)  # pure; computed before any group so nothing below can fail on arithmetic

    grids, pgs = _create_groups(layout, ranks, backend=backend, timeout=timeout)
    if not layout.contains(rank):
        # Nothing to hand out; the grids only hold non-member placeholders, so nothing to destroy either.
        return None
    pgc = _collection(pgs)
    loose = [pg for pg in (pgs["embd"], pgs["pos_embd"]) if pg is not None]
    setattr(pgc, _OWNED_ATTR, _Owned(grids=list(grids.values()), loose_groups=loose))
    return pgc


def _create_groups(
    layout: ResolvedLayout, ranks: dict[str, list[list[int]]], *, backend: str | None, timeout: timedelta | None
) -> tuple[dict[str, HyperCommGrid], dict[str, dist.ProcessGroup | None]]:
    """Every group of ``layout`` (collective over the world): the grids' dims, then the embedding groups."""
    extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    grids = {
        "dense": HyperCommGrid(layout.dense_shape, list(DENSE_DIM_NAMES), layout.rank_offset, backend),
        "expert": HyperCommGrid(layout.expert_shape, list(EXPERT_DIM_NAMES), layout.rank_offset, backend),
    }
    tag = str(layout.name).upper()
    pgs: dict[str, dist.ProcessGroup | None] = {}
    for group, (grid, dims) in GROUP_DIMS.items():
        pgs[group] = grids[grid].create_pg(list(dims), group_desc=f"{tag}_{group.upper()}", **extra)
    for group in ("embd", "pos_embd"):
        # Not a grid dim: subsets of the pipeline groups, created like Bridge does. Every rank calls this, and gets
        # ``None`` when it is in no subgroup (middle pipeline stages for ``embd``).
        pgs[group], _ = dist.new_subgroups_by_enumeration(  # type: ignore[assignment]  # a group or None, not -100
            ranks[group], backend=backend, group_desc=f"{tag}_{group.upper()}", **extra
        )
    return grids, pgs


def _collection(pgs: dict[str, dist.ProcessGroup | None]) -> ProcessGroupCollection:
    """The collection of one rank's groups, with the fields Bridge leaves unset filled
    (:func:`build_submodule_collection` says which and why)."""
    pgc = ProcessGroupCollection(
        tp=pgs["tp"],
        pp=pgs["pp"],
        mp=pgs["mp"],
        embd=pgs["embd"],
        pos_embd=pgs["pos_embd"],
        cp=pgs["cp"],
        tp_cp=pgs["tp_cp"],
        hcp=None,  # hierarchical CP is not supported without parallel_state (Bridge raises NotImplementedError)
        ep=pgs["ep"],
        expt_tp=pgs["expt_tp"],
        tp_ep=pgs["tp_ep"],
        tp_ep_pp=pgs["tp_ep_pp"],
        tp_ep_pp_with_egtp_remat=pgs["tp_ep_pp"],
        tp_dp_cp=pgs["tp_dp_cp"],
        dp=pgs["dp"],
        dp_cp=pgs["dp_cp"],
        dp_cp_gtp_remat=pgs["dp_cp"],
        expt_dp=pgs["expt_dp"],
        expt_dp_gtp_remat=pgs["expt_dp"],
        intra_dp_cp=pgs["dp_cp"],
        intra_expt_dp=pgs["expt_dp"],
        inter_dist_opt=None,
        intra_dist_opt=pgs["intra_dist_opt"],
    )
    # ``tp_dp`` is not a declared field of ProcessGroupCollection in megatron-core 0.19.2, so its __init__ rejects
    # it, yet ``TECudaGraphHelper._get_amax_reduction_group(with_context_parallel=False)`` reads
    # ``pg_collection.tp_dp`` (FP8 amax reduction inside the graphs). Set it on the instance after construction.
    pgc.tp_dp = pgs["tp_dp"]
    return pgc


def build_collections(
    language: ParallelLayout,
    vision: VisionLayout | None,
    *,
    world_size: int | None = None,
    backend: str | None = None,
    timeout: timedelta | None = None,
) -> MultiModuleProcessGroupCollection:
    """Build the language collection and, when ``vision`` is given, the vision one on the language first stage.

    Both layouts are validated before any group is created. Collective over the whole world: every rank calls it.

    Args:
        language: Language model sizes; its grid spans the whole world.
        vision: Vision encoder sizes, or ``None`` for a text-only model.
        world_size: Expected world size, checked against ``torch.distributed``; defaults to it.
        backend: Backend of every group; ``None`` means the default group's backend.
        timeout: Timeout of every group; ``None`` means the default.

    Returns:
        A ``MultiModuleProcessGroupCollection`` keyed by :class:`Submodule` values, with
        ``language_model_module_name="language"``. The ``"vision"`` entry is absent (not ``None``) on ranks outside
        the vision grid (later pipeline stages).
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("torch.distributed must be initialized before building process groups")
    resolved = resolve_submodules(language, vision, dist.get_world_size() if world_size is None else world_size)
    module_pgs: dict[str, ProcessGroupCollection] = {}
    for submodule, layout in resolved.items():  # same order on every rank: language, then vision
        pgc = build_submodule_collection(layout, backend=backend, timeout=timeout)
        if pgc is not None:
            module_pgs[str(submodule)] = pgc
    if Submodule.VISION in resolved:
        _attach_replica_group(
            module_pgs.get(str(Submodule.VISION)), resolved[Submodule.LANGUAGE], resolved[Submodule.VISION]
        )
    return MultiModuleProcessGroupCollection(module_pgs=module_pgs, language_model_module_name=str(Submodule.LANGUAGE))


def _attach_replica_group(vision_pgc, language: ResolvedLayout, vision: ResolvedLayout) -> None:
    """The vision replica groups over the language TP groups of the first stage (collective; see
    :mod:`bridge_cudagraph.vision.replicas`)."""
    from bridge_cudagraph.vision.replicas import build_replica_group

    first_stage = set(language.first_stage_ranks)
    tp_groups = [g for g in rank_layout(language)["tp"] if set(g) <= first_stage]
    build_replica_group(vision_pgc, tp_groups, vision.tp)


def layout_of_collection(pgc: ProcessGroupCollection, *, name: Submodule | str = Submodule.LANGUAGE) -> ResolvedLayout:
    """Read the layout back from a collection that spans the world, checking it matches the grid enumeration.

    Only ``tp``, ``cp``, ``dp``, ``pp`` (and ``ep``/``expt_tp`` when present) group sizes are read; the membership of
    this rank's ``tp``, ``cp``, ``dp`` and ``pp`` groups is then compared with
    :func:`bridge_cudagraph.parallel.layout.rank_layout`, so a collection built in another dim order is rejected
    instead of silently misplacing the vision encoder. Local (no collective).

    Args:
        pgc: A collection covering all ranks, e.g. the one Bridge builds with ``dist.use_decentralized_pg=True``.
        name: Submodule name for messages.

    Returns:
        The resolved layout of ``pgc``.

    Raises:
        LayoutError: A required group is missing, the sizes do not multiply to the world size, or the membership
            differs from the ``[tp, cp, dp, pp]`` grid enumeration.
    """
    name = Submodule(name)
    missing = [g for g in ("tp", "cp", "dp", "pp") if getattr(pgc, g, None) is None]
    if missing:
        raise LayoutError(f"{name} process group collection has no {', '.join(missing)} group")
    world = dist.get_world_size()
    sizes = {g: getattr(pgc, g).size() for g in ("tp", "cp", "dp", "pp")}
    ep = pgc.ep.size() if getattr(pgc, "ep", None) is not None else 1
    etp = pgc.expt_tp.size() if getattr(pgc, "expt_tp", None) is not None else None
    layout = ParallelLayout(tp=sizes["tp"], cp=sizes["cp"], pp=sizes["pp"], ep=ep, etp=etp, dp=sizes["dp"])
    resolved = layout.resolve(world, name=name)
    expected = rank_layout(resolved)
    rank = dist.get_rank()
    for group in ("tp", "cp", "dp", "pp"):
        actual = sorted(dist.get_process_group_ranks(getattr(pgc, group)))
        mine = next(r for r in expected[group] if rank in r)
        if actual != mine:
            raise LayoutError(
                f"{name} {group} group of rank {rank} is {actual}, but a [tp, cp, dp, pp] grid of "
                f"tp {resolved.tp} x cp {resolved.cp} x dp {resolved.dp} x pp {resolved.pp} puts it in {mine} "
                f"(build the collection with HyperCommGrid dims tp-cp-dp-pp, Megatron's default order)"
            )
    return resolved


def derive_vision_collection(
    language_pgc: ProcessGroupCollection,
    vision_tp: int = 1,
    *,
    num_attention_heads: int | None = None,
    vision_dp_when_cp: bool = False,
    backend: str | None = None,
    timeout: timedelta | None = None,
) -> ProcessGroupCollection | None:
    """Build the vision collection next to a language collection someone else built (e.g. Bridge).

    With ``dist.use_decentralized_pg=True`` Bridge builds the language collection itself; this reads its sizes
    (:func:`layout_of_collection`) and places the vision grid on its first pipeline stage. Collective over the whole
    world: every rank calls it, ranks outside the first stage get ``None``.

    Args:
        language_pgc: The language collection, spanning the whole world.
        vision_tp: Vision tensor-parallel size.
        num_attention_heads: The vision encoder's heads, to check ``vision_tp`` divides them.
        vision_dp_when_cp: Whether cp ranks split the images (see
        :class:`~bridge_cudagraph.parallel.layout.VisionLayout`).
        backend: Backend of every group; ``None`` means the default group's backend.
        timeout: Timeout of every group; ``None`` means the default.

    Returns:
        The vision collection on first-stage ranks, ``None`` elsewhere.
    """
    language = layout_of_collection(language_pgc, name=Submodule.LANGUAGE)
    vision = VisionLayout(
        tp=vision_tp, num_attention_heads=num_attention_heads, vision_dp_when_cp=vision_dp_when_cp
    ).resolve(language)
    vision_pgc = build_submodule_collection(vision, backend=backend, timeout=timeout)
    _attach_replica_group(vision_pgc, language, vision)
    return vision_pgc


def destroy_collections(
    collections: MultiModuleProcessGroupCollection | ProcessGroupCollection | Iterable[ProcessGroupCollection | None],
) -> None:
    """Destroy the process groups of collections built by this module; local, idempotent.

    Tears down the ``HyperCommGrid`` groups (``HyperCommGrid.destroy``) and the embedding groups this rank belongs
    to. Collections built elsewhere (e.g. by Bridge) are skipped: their owner destroys them. Call it after every
    CUDA graph that captured collectives on these groups has been deleted.

    Args:
        collections: What :func:`build_collections` returned, one collection, or an iterable of them (``None``
            entries, as returned on ranks outside a grid, are ignored).
    """
    if isinstance(collections, ProcessGroupCollection):
        items: Iterable[ProcessGroupCollection | None] = [collections]
    elif isinstance(collections, MultiModuleProcessGroupCollection):
        items = list(collections.values())
    else:
        items = collections
    for pgc in items:
        owned: _Owned | None = None if pgc is None else getattr(pgc, _OWNED_ATTR, None)
        if owned is None:
            continue
        for grid in owned.grids:
            grid.destroy()
        for pg in owned.loose_groups:
            if pg is not None and pg is not dist.GroupMember.NON_GROUP_MEMBER:
                dist.destroy_process_group(pg)
        owned.grids.clear()
        owned.loose_groups.clear()
