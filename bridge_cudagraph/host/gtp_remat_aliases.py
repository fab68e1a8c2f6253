"""The GTP_remat fields of a process-group collection that megatron-core reads and Bridge leaves unset, set to the
very groups of their plain fields.

Host change:
  changes: fields of one host object, the ``ProcessGroupCollection`` Bridge 0.6.2 builds for
    ``dist.use_decentralized_pg=true``, which megatron-core 0.19.2 reads (MoE metric logging) and Bridge leaves unset
    (:func:`complete_bridge_collection`)
  written for: Bridge 0.6.2, megatron-core 0.19.2
  gate: :func:`~bridge_cudagraph.host.compat.collection_declares_gtp_remat_groups`
  undo: :func:`restore_bridge_collection` (the provider leaves them for the life of the collection)
"""

from __future__ import annotations

from typing import Any

from bridge_cudagraph.host import compat

__all__ = ["COMPLETED", "complete_bridge_collection", "restore_bridge_collection"]


#: Set on a collection :func:`complete_bridge_collection` changed: the names of the fields it set.
COMPLETED = "_bridge_cudagraph_completed"


def complete_bridge_collection(pgc: Any, config: Any) -> tuple[str, ...]:
    """Give a ``ProcessGroupCollection`` the GTP_remat fields megatron-core reads and Bridge leaves unset, each the
    very group of its plain field (:data:`~bridge_cudagraph.host.compat.GTP_REMAT_ALIASES`: ``dp_cp_gtp_remat =
    dp_cp``, ``expt_dp_gtp_remat = expt_dp``, ``tp_ep_pp_with_egtp_remat = tp_ep_pp``). Only unset fields are set, so a
    collection built by :mod:`bridge_cudagraph.parallel.groups` (which sets them) or by a Bridge that sets them is left
    as it is; idempotent.

    Patches: fields of one object, the collection Megatron-Bridge 0.6.2 builds with ``dist.use_decentralized_pg=true``
    (``training/initialize.py``, ``_create_pg_collection``) and hands both to the model provider
    (``setup.py``) and to its training loop (``pretrain.py`` -> ``train.py`` -> ``training_log``). Why:
    for an MoE model Bridge's ``training_log`` calls megatron-core 0.19.2's ``track_moe_metrics``
    (``utils/train_utils.py``), whose ``MoEMetricsTracker._sync_metrics`` (``moe_logging.py``) averages
    over ``pg_collection.dp_cp_gtp_remat`` and, finding ``None``, asks ``parallel_state.get_data_parallel_group``,
    which under pure M4 raises "data parallel group (with GTP_remat) is not initialized" at the first training log,
    graphs or not. TE's grouped experts also read ``expt_dp_gtp_remat`` for the checkpoint's replica ids
    (``extensions/transformer_engine.py``; ``None`` there makes every expert-data-parallel rank a writer of the
    same ``_extra_state``). With GTP_remat off the aliases are exact: ``parallel_state`` builds the same aliases
    (``parallel_state.py``). Gate:
    :func:`~bridge_cudagraph.host.compat.collection_declares_gtp_remat_groups` (a core without these fields reads
    none). Undone by :func:`restore_bridge_collection`.

    Args:
        pgc: The collection (Bridge's, or any ``ProcessGroupCollection``).
        config: The model's config (the provider), for its GTP_remat sizes.

    Returns:
        The names of the fields set now (empty when there was nothing to set).

    Raises:
        RuntimeError: GTP_remat is on (``gtp_weight_remat_size`` or ``expert_gtp_weight_remat_size`` above 1) and a
            GTP_remat field is unset: the plain group would be the wrong one, and Bridge built no GTP_remat group
            (``bridge_cudagraph.plan.checks.check_decentralized`` refuses the setting before any group exists).
    """
    if not compat.collection_declares_gtp_remat_groups():
        return ()
    missing = [name for name in compat.GTP_REMAT_ALIASES if name not in vars(pgc)]
    if not missing:
        return ()
    sizes = {n: int(getattr(config, n, 1) or 1) for n in ("gtp_weight_remat_size", "expert_gtp_weight_remat_size")}
    if any(size > 1 for size in sizes.values()):
        settings = ", ".join(f"model.{n}={v}" for n, v in sizes.items())
        raise RuntimeError(
            f"the process group collection has no {', '.join(missing)} group, and with {settings} it is not "
            f"{compat.GTP_REMAT_ALIASES[missing[0]]}; Megatron-Bridge builds no GTP_remat groups under "
            "dist.use_decentralized_pg=true"
        )
    set_now = []
    for name in missing:
        group = getattr(pgc, compat.GTP_REMAT_ALIASES[name], None)
        if group is not None:  # an unset plain field: nothing to alias, the field stays unset too
            setattr(pgc, name, group)
            set_now.append(name)
    if set_now:
        setattr(pgc, COMPLETED, (*getattr(pgc, COMPLETED, ()), *set_now))
    return tuple(set_now)


def restore_bridge_collection(pgc: Any) -> None:
    """Undo :func:`complete_bridge_collection`: the fields it set are unset again (read as ``None``)."""
    for name in getattr(pgc, COMPLETED, ()):
        vars(pgc).pop(name, None)
    vars(pgc).pop(COMPLETED, None)
