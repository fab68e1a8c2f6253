"""Real process groups from ``bridge_cudagraph.parallel.groups`` in multi-process gloo worlds of 1, 2 and 4 ranks.

Every case runs on every rank of its world and checks, per submodule and per group name, that this rank's group holds
exactly the ranks :func:`bridge_cudagraph.parallel.layout.rank_layout` predicts, that an all-reduce of the rank over it
sums those ranks, that the collection satisfies megatron-core's DDP/optimizer helpers and the TE graph helper's
amax-group lookup, and that ``megatron.core.parallel_state`` was neither called nor modified.

One spawn per world size runs all of its cases (imports dominate the cost); each case is still its own test id.
Cases catch their own failures so one broken case does not hide the others.
"""

from __future__ import annotations

import functools
import re
import traceback
from types import SimpleNamespace
from typing import Any

import pytest
from _dist import bridge_collection as _bridge_collection
from _dist import no_parallel_state as _no_parallel_state
from _dist import run_world
from _dist import tripwire as _tripwire

pytestmark = pytest.mark.slow

# name -> (world size, kind, language kwargs, vision kwargs or None)
CASES: dict[str, tuple[int, str, dict[str, Any], dict[str, Any] | None]] = {
    "w1-dense-vision": (1, "build", {}, {}),
    "w2-tp2-vision-tp1": (2, "build", {"tp": 2}, {"tp": 1}),
    "w2-tp2-vision-tp2": (2, "build", {"tp": 2}, {"tp": 2, "num_attention_heads": 16}),
    "w2-pp2-vision-tp1": (2, "build", {"pp": 2}, {"tp": 1}),
    "w2-ep2-text-only": (2, "build", {"ep": 2}, None),
    "w4-tp2-pp2-vision-tp1": (4, "build", {"tp": 2, "pp": 2}, {"tp": 1}),
    "w4-tp2-dp2-ep2-etp1-vision-tp2": (4, "build", {"tp": 2, "ep": 2, "etp": 1}, {"tp": 2}),
    "w4-cp2-pp2-vision-tp1": (4, "build", {"cp": 2, "pp": 2}, {"tp": 1}),
    "w4-bad-vision-no-side-effects": (4, "bad_layout", {"tp": 2, "pp": 2}, {"tp": 4}),
    "w4-derive-from-bridge-tp2-pp2": (4, "derive_bridge", {"tp": 2, "pp": 2}, {"tp": 1}),
    "w2-derive-from-bridge-cp2": (2, "derive_bridge", {"cp": 2}, {"tp": 2}),
}

# The ProcessGroupCollection fields that must be the very same group object as another one.
ALIASES = {
    "dp_cp_gtp_remat": "dp_cp",
    "expt_dp_gtp_remat": "expt_dp",
    "tp_ep_pp_with_egtp_remat": "tp_ep_pp",
    "intra_dp_cp": "dp_cp",
    "intra_expt_dp": "expt_dp",
}


# ---------------------------------------------------------------------------------------------- runs in children


def _parallel_state_snapshot() -> dict[str, Any]:
    from megatron.core import parallel_state as ps

    return {k: v for k, v in vars(ps).items() if re.fullmatch(r"_[A-Z0-9_]+|_global_[a-z_]+", k)}


def _assert_parallel_state_untouched(before: dict[str, Any]) -> None:
    from megatron.core import parallel_state as ps

    assert ps.model_parallel_is_initialized() is False
    after = _parallel_state_snapshot()
    assert after.keys() == before.keys()
    for key, value in after.items():
        assert value is before[key], f"parallel_state.{key} changed"
        if "GROUP" in key and not isinstance(value, dict):
            assert value is None, f"parallel_state.{key} is {value!r}"
    assert ps._HYBRID_DP_CP_GROUPS == {}


def _check_collection(rank: int, pgc: Any, layout: Any) -> None:
    import torch
    import torch.distributed as dist
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.cuda_graphs import TECudaGraphHelper

    from bridge_cudagraph.parallel.layout import rank_layout

    for group, rank_lists in rank_layout(layout).items():
        mine = [ranks for ranks in rank_lists if rank in ranks]
        pg = getattr(pgc, group)
        if not mine:
            assert pg is None, f"{layout.name}.{group}: rank {rank} should be in no group"
            continue
        (expected,) = mine
        assert sorted(dist.get_process_group_ranks(pg)) == expected, f"{layout.name}.{group}"
        t = torch.tensor([rank], dtype=torch.int64)
        dist.all_reduce(t, group=pg)
        assert t.item() == sum(expected), f"{layout.name}.{group}: all_reduce {t.item()} != {sum(expected)}"

    for alias, target in ALIASES.items():
        assert getattr(pgc, alias) is getattr(pgc, target), alias
    assert pgc.inter_dist_opt is None and pgc.hcp is None
    assert "tp_dp" in vars(pgc)  # set after construction, not a declared field

    # Consumers: DDP and the distributed optimizer must accept it without creating groups or reading globals.
    ddp_config = SimpleNamespace(num_distributed_optimizer_instances=1, use_distributed_optimizer=True)
    with _tripwire(dist, ["new_group"]):
        ddp = ProcessGroupCollection.setup_process_groups_for_ddp(
            pgc, SimpleNamespace(context_parallel_size=layout.cp), ddp_config
        )
        opt = ProcessGroupCollection.setup_process_groups_for_optimizer(
            pgc, [SimpleNamespace(ddp_config=ddp_config)], use_gloo_process_groups=False
        )
    assert ddp["expt_dp_group"] is pgc.expt_dp and ddp["ep_group"] is pgc.ep
    assert opt["intra_dist_opt_group"] is pgc.intra_dist_opt and opt["mp_group"] is pgc.mp
    assert opt["expt_tp_pp_group"] is pgc.tp_ep_pp
    # TE graph helper's FP8 amax-reduction group lookup, with and without context parallelism.
    helper = SimpleNamespace(pg_collection=pgc)
    assert TECudaGraphHelper._get_amax_reduction_group(helper, with_context_parallel=False) is pgc.tp_dp
    assert TECudaGraphHelper._get_amax_reduction_group(helper, with_context_parallel=True) is pgc.tp_dp_cp


def _case_build(rank: int, world: int, lang: dict[str, Any], vis: dict[str, Any] | None) -> None:
    from bridge_cudagraph.parallel.groups import build_collections, destroy_collections
    from bridge_cudagraph.parallel.layout import ParallelLayout, Submodule, VisionLayout, resolve_submodules

    before = _parallel_state_snapshot()
    language, vision = ParallelLayout(**lang), (None if vis is None else VisionLayout(**vis))
    resolved = resolve_submodules(language, vision, world)
    with _no_parallel_state():
        mm = build_collections(language, vision, world_size=world, backend="gloo")
    assert mm.language_model_module_name == Submodule.LANGUAGE
    for submodule, layout in resolved.items():
        if layout.contains(rank):
            _check_collection(rank, mm[str(submodule)], layout)
        else:
            assert str(submodule) not in mm.keys(), f"rank {rank} outside the {submodule} grid has an entry"
    if vision is None:
        assert list(mm.keys()) == [Submodule.LANGUAGE]
    _assert_parallel_state_untouched(before)
    destroy_collections(mm)
    destroy_collections(mm)  # idempotent


def _case_bad_layout(rank: int, world: int, lang: dict[str, Any], vis: dict[str, Any] | None) -> None:
    import torch.distributed as dist

    from bridge_cudagraph.parallel.groups import build_collections
    from bridge_cudagraph.parallel.layout import LayoutError, ParallelLayout, VisionLayout

    assert vis is not None
    # The language layout is valid, the vision one is not: nothing at all may be created.
    with _tripwire(dist, ["new_group", "new_subgroups_by_enumeration"]), pytest.raises(LayoutError, match="vision tp"):
        build_collections(ParallelLayout(**lang), VisionLayout(**vis), backend="gloo")


def _case_derive_bridge(rank: int, world: int, lang: dict[str, Any], vis: dict[str, Any] | None) -> None:
    from bridge_cudagraph.parallel.groups import derive_vision_collection, destroy_collections, layout_of_collection
    from bridge_cudagraph.parallel.layout import ParallelLayout, Submodule, VisionLayout

    assert vis is not None
    before = _parallel_state_snapshot()
    language_pgc = _bridge_collection(lang)
    with _no_parallel_state():
        resolved = layout_of_collection(language_pgc)
        vision_pgc = derive_vision_collection(language_pgc, vis["tp"], backend="gloo")
    assert resolved == ParallelLayout(**lang).resolve(world)
    vision = VisionLayout(**vis).resolve(resolved)
    if vision.contains(rank):
        assert vision_pgc is not None
        _check_collection(rank, vision_pgc, vision)
        assert vision.name == Submodule.VISION
    else:
        assert vision_pgc is None
    _assert_parallel_state_untouched(before)
    destroy_collections([vision_pgc])


_KINDS = {"build": _case_build, "bad_layout": _case_bad_layout, "derive_bridge": _case_derive_bridge}


def _run_cases(rank: int, world: int, names: list[str]) -> dict[str, str | None]:
    """Run every case of this world on this rank; map case name -> traceback, or None when it passed."""
    import logging

    logging.getLogger().setLevel(logging.WARNING)  # HyperCommGrid logs every group on rank 0
    out: dict[str, str | None] = {}
    for name in names:
        _, kind, lang, vis = CASES[name]
        try:
            _KINDS[kind](rank, world, lang, vis)
            out[name] = None
        except Exception:
            out[name] = traceback.format_exc()
    return out


# ------------------------------------------------------------------------------------------------- in the parent


@functools.cache
def _world_results(world: int) -> tuple[dict[str, str | None], ...]:
    names = [name for name, (w, *_) in CASES.items() if w == world]
    return tuple(run_world(world, _run_cases, names))


@pytest.mark.parametrize("case", list(CASES))
def test_case(case: str) -> None:
    world = CASES[case][0]
    failures = [f"rank {rank}:\n{res[case]}" for rank, res in enumerate(_world_results(world)) if res[case]]
    assert not failures, "\n".join(failures)
