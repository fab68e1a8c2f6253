"""Issue #35: Megatron-Bridge's pure-M4 collection under megatron-core's MoE metric logging, in real gloo worlds.

Bridge builds the collection of ``dist.use_decentralized_pg=true`` itself (``_create_pg_collection``, run here
unchanged on gloo) and logs every MoE step with it: ``training_log`` -> ``track_moe_metrics`` ->
``MoEMetricsTracker._sync_metrics``, which averages over ``pg_collection.dp_cp_gtp_remat`` and, finding none, asks
``parallel_state``. Every case, on every rank:

* Bridge's collection has no ``dp_cp_gtp_remat`` (nor ``expt_dp_gtp_remat``, ``tp_ep_pp_with_egtp_remat``), and
  megatron-core's ``track_moe_metrics`` with it raises the very error of the issue ("data parallel group (with
  GTP_remat) is not initialized");
* the plugin's provider, given that collection by ``provide_distributed_model`` as Bridge gives it, completes it
  before anything is built from it: each GTP_remat field is the very group of its plain field;
* then ``track_moe_metrics``, called as Bridge's ``training_log`` calls it, runs with every ``parallel_state`` function
  trip-wired and returns the reduction the layout predicts (sum over tensor x context parallel, average over data x
  context parallel, computed here from :func:`bridge_cudagraph.parallel.layout.rank_layout`, not from the groups);
* the undo leaves the fields unset again, and ``parallel_state`` was never initialised.

No mocks of the host: the tracker, ``track_moe_metrics``, Bridge's collection builder and the process groups are the
installed ones; the model provider's base class is a stand-in that only records what it was given.
"""

from __future__ import annotations

import functools
import traceback
from typing import Any

import pytest
from _dist import bridge_collection, no_parallel_state, run_world

pytestmark = pytest.mark.slow

# name -> (world size, language sizes)
CASES: dict[str, tuple[int, dict[str, Any]]] = {
    "w2-dp2": (2, {}),
    "w4-tp2-dp2": (4, {"tp": 2}),
    "w4-cp2-dp2": (4, {"cp": 2}),
    "w4-tp2-dp2-ep2-etp1": (4, {"tp": 2, "ep": 2, "etp": 1}),
}
LAYERS = 2
ALIASES = {"dp_cp_gtp_remat": "dp_cp", "expt_dp_gtp_remat": "expt_dp", "tp_ep_pp_with_egtp_remat": "tp_ep_pp"}


def _value(rank: int, layer: int) -> float:
    """What rank ``rank`` records for layer ``layer`` (1-based): distinct per rank and per layer."""
    return float((rank + 1) * 10 ** (layer - 1))


def _expected(rank: int, world: int, lang: dict[str, Any]) -> dict[str, float]:
    """The reported metrics, from the layout alone: ``load_balancing_loss`` (recorded like the router's aux loss:
    summed over tp x cp, then averaged over dp x cp) and ``z_loss`` (averaged over tp x dp x cp, then over dp x cp),
    each summed over the layers and divided by their number."""
    from bridge_cudagraph.parallel.layout import ParallelLayout, rank_layout

    groups = rank_layout(ParallelLayout(**lang).resolve(world))

    def mine(name: str, r: int) -> list[int]:
        return next(g for g in groups[name] if r in g)

    out = {"load_balancing_loss": 0.0, "z_loss": 0.0}
    for layer in range(1, LAYERS + 1):
        summed = {r: sum(_value(s, layer) for s in mine("tp_cp", r)) for r in range(world)}
        dp_cp = mine("dp_cp", rank)
        out["load_balancing_loss"] += sum(summed[r] for r in dp_cp) / len(dp_cp)
        everyone = mine("tp_dp_cp", rank)
        out["z_loss"] += sum(_value(r, layer) for r in everyone) / len(everyone)
    return {k: v / LAYERS for k, v in out.items()}


def _record(pgc: Any) -> None:
    """One step's per-layer metrics, recorded as megatron-core's router records them (``router.py:596``, ``:697``)."""
    import torch
    import torch.distributed as dist
    from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker

    tracker = get_moe_metrics_tracker()
    for layer in range(1, LAYERS + 1):
        value = torch.tensor(_value(dist.get_rank(), layer))
        tracker.record("load_balancing_loss", value, layer, LAYERS, reduce_group=pgc.tp_cp)
        tracker.record("z_loss", value, layer, LAYERS, avg_group=pgc.tp_dp_cp)


def _log_like_bridge(pgc: Any) -> dict[str, float]:
    """``track_moe_metrics`` with the arguments Bridge's ``training_log`` passes (``utils/train_utils.py:1082``)."""
    from megatron.core.transformer.moe.moe_utils import track_moe_metrics

    total: dict[str, Any] = {}
    track_moe_metrics(
        loss_scale=1.0,
        iteration=1,
        writer=None,
        wandb_writer=None,
        total_loss_dict=total,
        per_layer_logging=False,
        force_initialize=True,
        track_names=["load_balancing_loss", "z_loss"],
        num_layers=LAYERS,
        moe_layer_freq=None,
        mtp_num_layers=None,
        pg_collection=pgc,
    )
    return {k: float(v) for k, v in total.items()}


class _BridgeProviderStandIn:
    """The host provider's ``provide_distributed_model``: builds nothing, remembers the collection's GTP_remat
    fields as the model build would read them."""

    def provide_distributed_model(self, *args: Any, **kwargs: Any) -> list:
        pgc = kwargs["pg_collection"]
        self.seen = {name: getattr(pgc, name) for name in ALIASES}
        return []


def _case(rank: int, world: int, lang: dict[str, Any]) -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.moe.moe_logging import destroy_moe_metrics_tracker

    from bridge_cudagraph.bridge.mixin import CudaGraphProviderMixin
    from bridge_cudagraph.host import compat
    from bridge_cudagraph.host.gtp_remat_aliases import COMPLETED, restore_bridge_collection

    assert compat.GTP_REMAT_ALIASES == ALIASES
    pgc = bridge_collection(lang)
    # The defect: Bridge's collection has none of the GTP_remat groups, and megatron-core's logging fails on it.
    assert all(name not in vars(pgc) and getattr(pgc, name) is None for name in ALIASES), vars(pgc).keys()
    destroy_moe_metrics_tracker()
    _record(pgc)
    with pytest.raises(AssertionError, match=r"data parallel group \(with GTP_remat\) is not initialized"):
        _log_like_bridge(pgc)
    destroy_moe_metrics_tracker()

    # The fix, through the provider as Bridge's setup calls it (setup.py: provide_distributed_model(pg_collection=)).
    provider_cls = type("Provider", (CudaGraphProviderMixin, _BridgeProviderStandIn), {})
    provider = provider_cls()
    assert provider.provide_distributed_model(ddp_config=None, pg_collection=pgc) == []
    for name, target in ALIASES.items():
        assert getattr(pgc, name) is getattr(pgc, target) is not None, name
        assert provider.seen[name] is getattr(pgc, target), f"{name}: set only after the model was built"
    assert sorted(dist.get_process_group_ranks(pgc.dp_cp_gtp_remat)) == sorted(dist.get_process_group_ranks(pgc.dp_cp))
    assert set(getattr(pgc, COMPLETED)) == set(ALIASES)

    with no_parallel_state():
        _record(pgc)
        got = _log_like_bridge(pgc)
    expected = _expected(rank, world, lang)
    assert got.keys() == expected.keys(), got
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=1e-6), (name, got[name], value)
    destroy_moe_metrics_tracker()

    restore_bridge_collection(pgc)
    assert all(name not in vars(pgc) and getattr(pgc, name) is None for name in ALIASES)
    assert COMPLETED not in vars(pgc) and pgc.dp_cp is not None
    assert ps.model_parallel_is_initialized() is False
    assert ps._DATA_PARALLEL_GROUP is None and ps._DATA_PARALLEL_GROUP_WITH_GTP_REMAT is None


def _run_cases(rank: int, world: int, names: list[str]) -> dict[str, str | None]:
    """Every case of this world on this rank: case name -> traceback, or None when it passed."""
    import logging

    logging.getLogger().setLevel(logging.WARNING)  # HyperCommGrid logs every group on rank 0
    out: dict[str, str | None] = {}
    for name in names:
        try:
            _case(rank, world, CASES[name][1])
            out[name] = None
        except Exception:
            out[name] = traceback.format_exc()
    return out


@functools.cache
def _world_results(world: int) -> tuple[dict[str, str | None], ...]:
    names = [name for name, (w, _) in CASES.items() if w == world]
    return tuple(run_world(world, _run_cases, names))


@pytest.mark.parametrize("case", list(CASES))
def test_moe_metrics_log_on_bridges_collection(case: str) -> None:
    world = CASES[case][0]
    failures = [f"rank {rank}:\n{res[case]}" for rank, res in enumerate(_world_results(world)) if res[case]]
    assert not failures, "\n".join(failures)
