"""``bridge_cudagraph.host.gtp_remat_aliases``: the GTP_remat fields Bridge leaves unset are set, and unset again
by the undo."""

from __future__ import annotations

import types

import pytest

from bridge_cudagraph.host import compat, gtp_remat_aliases


def test_bridge_collection_is_completed_and_restored():
    """The GTP_remat fields Bridge leaves unset become the very groups of their plain fields, only where unset, and
    the undo leaves them unset again; with GTP_remat on nothing is aliased (the plain group would be wrong)."""
    from megatron.core.process_groups_config import ProcessGroupCollection

    assert compat.collection_declares_gtp_remat_groups()  # megatron-core 0.19.2 (TESTED_STACK)
    dp_cp, expt_dp, tp_ep_pp, own = object(), object(), object(), object()
    pgc = ProcessGroupCollection(dp_cp=dp_cp, expt_dp=expt_dp, tp_ep_pp=tp_ep_pp, expt_dp_gtp_remat=own)
    assert pgc.dp_cp_gtp_remat is None  # unset reads as None: what megatron-core's MoE logging then falls back on
    config = types.SimpleNamespace(gtp_weight_remat_size=1, expert_gtp_weight_remat_size=1)
    assert gtp_remat_aliases.complete_bridge_collection(pgc, config) == ("dp_cp_gtp_remat", "tp_ep_pp_with_egtp_remat")
    assert pgc.dp_cp_gtp_remat is dp_cp and pgc.tp_ep_pp_with_egtp_remat is tp_ep_pp
    assert pgc.expt_dp_gtp_remat is own  # set by whoever built it: kept
    assert gtp_remat_aliases.complete_bridge_collection(pgc, config) == ()  # idempotent
    gtp_remat_aliases.restore_bridge_collection(pgc)
    assert "dp_cp_gtp_remat" not in vars(pgc) and "tp_ep_pp_with_egtp_remat" not in vars(pgc)
    assert pgc.dp_cp_gtp_remat is None and pgc.expt_dp_gtp_remat is own and pgc.dp_cp is dp_cp
    gtp_remat_aliases.restore_bridge_collection(pgc)  # a second undo changes nothing
    assert pgc.expt_dp_gtp_remat is own

    bare = ProcessGroupCollection(tp=object())  # no plain groups: nothing to alias, nothing set
    assert gtp_remat_aliases.complete_bridge_collection(bare, config) == () and "dp_cp_gtp_remat" not in vars(bare)

    for gtp in ("gtp_weight_remat_size", "expert_gtp_weight_remat_size"):
        on = types.SimpleNamespace(**{**vars(config), gtp: 2})
        fresh = ProcessGroupCollection(dp_cp=dp_cp, expt_dp=expt_dp, tp_ep_pp=tp_ep_pp)
        with pytest.raises(RuntimeError, match=f"model.{gtp}=2"):
            gtp_remat_aliases.complete_bridge_collection(fresh, on)
        assert "dp_cp_gtp_remat" not in vars(fresh)
