"""Pure tests of ``bridge_cudagraph.parallel.layout``: validation messages, group partitions, and exact agreement with
megatron-core's ``HyperCommGrid`` and ``parallel_state.RankGenerator`` enumerations (no process is created)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import bridge_cudagraph.parallel.layout
from bridge_cudagraph.parallel.layout import (
    DENSE_DIM_NAMES,
    EXPERT_DIM_NAMES,
    GROUP_DIMS,
    LayoutError,
    ParallelLayout,
    ResolvedLayout,
    Submodule,
    VisionLayout,
    enumerate_grid,
    format_layout,
    rank_layout,
    resolve_submodules,
)

pytestmark = pytest.mark.fast

# (world size, ParallelLayout kwargs)
LAYOUTS: list[tuple[int, dict[str, int | None]]] = [
    (1, {}),
    (2, {"tp": 2}),
    (2, {"pp": 2}),
    (2, {"cp": 2}),
    (2, {"ep": 2}),
    (2, {"dp": 2}),
    (4, {"tp": 2, "pp": 2}),
    (4, {"tp": 2, "cp": 2}),
    (4, {"cp": 2, "pp": 2}),
    (4, {"tp": 2, "ep": 2}),
    (4, {"tp": 2, "ep": 2, "etp": 1}),
    (4, {"ep": 4}),
    (8, {"tp": 2, "cp": 2, "pp": 2}),
    (8, {"tp": 4, "pp": 2, "ep": 2, "etp": 1}),
    (8, {"ep": 8}),
    (8, {"tp": 2, "pp": 2, "ep": 4, "etp": 1}),
    (8, {"cp": 2, "ep": 4}),
    (64, {"tp": 8, "pp": 4}),
    (64, {"tp": 4, "cp": 2, "pp": 2, "ep": 8, "etp": 1}),
    (64, {"tp": 2, "cp": 4, "ep": 16}),
    (512, {"tp": 8, "cp": 2, "pp": 8, "ep": 8, "etp": 1}),
    (512, {"tp": 4, "pp": 4, "ep": 16, "etp": 2}),
]


def _ids(case: tuple[int, dict[str, int | None]]) -> str:
    world, kw = case
    return f"w{world}-" + ("-".join(f"{k}{v}" for k, v in kw.items()) or "dense")


def _expected_sizes(r: ResolvedLayout) -> dict[str, int]:
    return {
        "tp": r.tp,
        "cp": r.cp,
        "pp": r.pp,
        "dp": r.dp,
        "mp": r.tp * r.pp,
        "tp_cp": r.tp * r.cp,
        "tp_dp_cp": r.tp * r.dp * r.cp,
        "dp_cp": r.dp * r.cp,
        "tp_dp": r.tp * r.dp,
        "ep": r.ep,
        "expt_tp": r.etp,
        "tp_ep": r.etp * r.ep,
        "tp_ep_pp": r.etp * r.ep * r.pp,
        "expt_dp": r.expt_dp,
        "intra_dist_opt": r.size,
    }


@pytest.fixture
def world_env(monkeypatch: pytest.MonkeyPatch):
    """HyperCommGrid reads $WORLD_SIZE when torch.distributed is not initialized: enough to enumerate ranks."""

    def set_world(world: int) -> None:
        monkeypatch.setenv("WORLD_SIZE", str(world))

    return set_world


# --------------------------------------------------------------------------------------------------- resolution


@pytest.mark.parametrize("case", LAYOUTS, ids=_ids)
def test_resolve_derives_dp_and_expert_dp(case: tuple[int, dict[str, int | None]]) -> None:
    world, kw = case
    r = ParallelLayout(**kw).resolve(world)
    assert r.name is Submodule.LANGUAGE and r.world_size == world and r.rank_offset == 0
    assert r.tp * r.cp * r.dp * r.pp == world
    assert r.etp == (kw.get("etp") or kw.get("tp", 1))
    assert r.etp * r.ep * r.expt_dp * r.pp == world
    assert list(r.ranks) == list(range(world))


def test_explicit_dp_that_matches_is_accepted() -> None:
    assert ParallelLayout(tp=2, pp=2, dp=2).resolve(8).dp == 2


def test_moe_does_not_require_dp_cp_divisible_by_ep() -> None:
    # Megatron folds cp into expert dp and only needs etp*ep*pp to divide the world: dp*cp = 2 here, ep = 4.
    r = ParallelLayout(tp=4, ep=4, etp=1).resolve(8)
    assert (r.dp, r.cp, r.ep, r.expt_dp) == (2, 1, 4, 2)


# ------------------------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("layout", "world", "message"),
    [
        (
            ParallelLayout(tp=4, cp=2, pp=2),
            24,
            "language tp 4 x cp 2 x pp 2 = 16 does not divide world size 24 "
            "(set tp/cp/pp so their product divides the number of GPUs)",
        ),
        (
            ParallelLayout(tp=2, pp=2, dp=3),
            8,
            "language tp 2 x cp 1 x dp 3 x pp 2 = 12 != world size 8 "
            "(world size 8 / 4 gives dp 2; leave dp unset to derive it)",
        ),
        (
            ParallelLayout(tp=1, ep=16),
            8,
            "language expert etp 1 x ep 16 x pp 1 = 16 does not divide world size 8 "
            "(set etp/ep so etp x ep x pp divides the number of GPUs)",
        ),
        (
            ParallelLayout(tp=2, ep=4, pp=2),
            8,
            "language expert etp 2 x ep 4 x pp 2 = 16 does not divide world size 8",
        ),
        (ParallelLayout(tp=0), 8, "language tp must be a positive integer, got 0"),
        (ParallelLayout(etp=-1), 8, "language etp must be a positive integer, got -1"),
        (ParallelLayout(dp=0), 8, "language dp must be a positive integer, got 0"),
        (ParallelLayout(), 0, "language world_size must be a positive integer, got 0"),
    ],
)
def test_language_errors_show_arithmetic(layout: ParallelLayout, world: int, message: str) -> None:
    with pytest.raises(LayoutError, match=re.escape(message)):
        layout.resolve(world)


def test_layout_error_is_a_value_error_and_names_the_submodule() -> None:
    with pytest.raises(ValueError, match=r"^vision tp 3"):
        ParallelLayout(tp=3).resolve(4, name=Submodule.VISION)


@pytest.mark.parametrize(
    ("language", "world", "vision", "message"),
    [
        (
            ParallelLayout(tp=2, pp=2),
            8,
            VisionLayout(tp=3),
            "vision tp 3 does not divide the 4 ranks of the language first pipeline stage "
            "(language tp 2 x cp 1 x dp 2 = 4; 4 % 3 = 1) (set vision tp to a divisor of 4)",
        ),
        (
            ParallelLayout(tp=2, pp=2),
            8,
            VisionLayout(tp=2, num_attention_heads=5),
            "vision tp 2 does not divide the 5 attention heads of the vision encoder (5 % 2 = 1) (set vision tp, "
            "model.cuda_graph.vision.tensor_parallel_size, to a divisor of 5: one of [1, 5])",
        ),
        (
            ParallelLayout(tp=2),
            8,
            VisionLayout(tp=4),
            "vision tp 4 does not divide language tp 2 x cp 1 = 2: its groups would span ranks that hold "
            "different images (set vision tp to a divisor of 2)",
        ),
        (
            ParallelLayout(tp=1, cp=2),
            4,
            VisionLayout(tp=2, vision_dp_when_cp=True),
            "vision tp 2 does not divide language tp 1: its groups would span ranks that hold different images "
            "(set vision tp to a divisor of 1)",
        ),
        (ParallelLayout(), 2, VisionLayout(tp=0), "vision tp must be a positive integer, got 0"),
        (
            ParallelLayout(),
            2,
            VisionLayout(num_attention_heads=0),
            "vision num_attention_heads must be a positive integer, got 0",
        ),
    ],
)
def test_vision_errors_show_arithmetic(
    language: ParallelLayout, world: int, vision: VisionLayout, message: str
) -> None:
    with pytest.raises(LayoutError, match=re.escape(message)):
        resolve_submodules(language, vision, world)


def test_vision_tp_may_span_cp_ranks_when_they_share_images() -> None:
    v = VisionLayout(tp=2).resolve(ParallelLayout(cp=2).resolve(4))
    assert (v.tp, v.dp, v.cp, v.pp) == (2, 2, 1, 1)


def test_resolved_layout_rejects_inconsistent_grids() -> None:
    with pytest.raises(LayoutError, match=re.escape("expert grid etp 1 x ep 1 x expt_dp 2 x pp 1 = 2 != dense grid")):
        ResolvedLayout(Submodule.LANGUAGE, world_size=4, tp=1, cp=1, dp=4, pp=1, ep=1, etp=1, expt_dp=2)
    with pytest.raises(LayoutError, match=re.escape("ends at rank 4, beyond world size 4")):
        ResolvedLayout(Submodule.VISION, world_size=4, tp=1, cp=1, dp=2, pp=1, ep=1, etp=1, expt_dp=2, rank_offset=3)


# ---------------------------------------------------------------------------------------------- rank layout


@pytest.mark.parametrize("case", LAYOUTS, ids=_ids)
def test_every_group_partitions_the_grid(case: tuple[int, dict[str, int | None]]) -> None:
    world, kw = case
    r = ParallelLayout(**kw).resolve(world)
    groups = rank_layout(r)
    sizes = _expected_sizes(r)
    assert set(groups) == set(GROUP_DIMS) | {"embd", "pos_embd"}
    for name, size in sizes.items():
        ranks = [x for g in groups[name] for x in g]
        assert sorted(ranks) == list(range(world)), f"{name}: each rank exactly once"
        assert {len(g) for g in groups[name]} == {size}, name
        assert len(groups[name]) == world // size, name
        assert all(g == sorted(g) for g in groups[name]), name
    # Embedding groups: one per pipeline group; the first stage (and the last) only.
    assert len(groups["embd"]) == len(groups["pos_embd"]) == len(groups["pp"]) == world // r.pp
    for pp_group, embd, pos in zip(groups["pp"], groups["embd"], groups["pos_embd"], strict=True):
        assert embd == ([pp_group[0]] if r.pp == 1 else [pp_group[0], pp_group[-1]])
        assert pos == [pp_group[0]]
    assert sorted(x for g in groups["pos_embd"] for x in g) == list(r.first_stage_ranks)


@pytest.mark.parametrize("case", LAYOUTS, ids=_ids)
def test_matches_hyper_comm_grid(case: tuple[int, dict[str, int | None]], world_env) -> None:
    hyper_comm_grid = pytest.importorskip("megatron.core.hyper_comm_grid")
    world, kw = case
    world_env(world)
    r = ParallelLayout(**kw).resolve(world)
    # Exactly Bridge's _create_pg_collection grids (single optimizer instance).
    grids = {
        "dense": hyper_comm_grid.HyperCommGrid(r.dense_shape, ["tp", "cp", "dp", "pp"], 0),
        "expert": hyper_comm_grid.HyperCommGrid(r.expert_shape, ["tp", "ep", "dp", "pp"], 0),
    }
    groups = rank_layout(r)
    for name, (grid, dims) in GROUP_DIMS.items():
        # get_rank_enum is, by its contract, the enumeration create_pg passes to new_subgroups_by_enumeration.
        assert groups[name] == grids[grid].get_rank_enum(list(dims)), name
    # Bridge derives the embedding groups from grid._gen_rank_enum(["pp"]).
    assert groups["pp"] == grids["dense"]._gen_rank_enum(["pp"])


@pytest.mark.parametrize("case", LAYOUTS, ids=_ids)
def test_same_groups_as_parallel_state(case: tuple[int, dict[str, int | None]]) -> None:
    """Same memberships as ``initialize_model_parallel`` (order tp-cp-ep-dp-pp), via its pure RankGenerator."""
    parallel_state = pytest.importorskip("megatron.core.parallel_state")
    world, kw = case
    r = ParallelLayout(**kw).resolve(world)
    dense = parallel_state.RankGenerator(tp=r.tp, ep=1, dp=r.dp, pp=r.pp, cp=r.cp, order="tp-cp-ep-dp-pp")
    expert = parallel_state.RankGenerator(tp=r.etp, ep=r.ep, dp=r.expt_dp, pp=r.pp, cp=1, order="tp-cp-ep-dp-pp")
    tokens = {
        "tp": (dense, "tp"),
        "cp": (dense, "cp"),
        "pp": (dense, "pp"),
        "dp": (dense, "dp"),
        "mp": (dense, "tp-pp"),
        "tp_cp": (dense, "tp-cp"),
        "tp_dp_cp": (dense, "tp-dp-cp"),
        "dp_cp": (dense, "dp-cp"),
        "tp_dp": (dense, "tp-dp"),
        "ep": (expert, "ep"),
        "expt_tp": (expert, "tp"),
        "tp_ep": (expert, "tp-ep"),
        "tp_ep_pp": (expert, "tp-ep-pp"),
        "expt_dp": (expert, "dp"),
    }
    groups = rank_layout(r)

    def as_set(lists: list[list[int]]) -> set[frozenset[int]]:
        return {frozenset(g) for g in lists}

    for name, (gen, token) in tokens.items():
        assert as_set(groups[name]) == as_set(gen.get_ranks(token)), name
    # parallel_state's intra-distributed-optimizer group for one instance: all tp-ep-pp groups concatenated.
    assert as_set(groups["intra_dist_opt"]) == {frozenset(x for g in expert.get_ranks("tp-ep-pp") for x in g)}
    assert as_set(groups["embd"]) == as_set([parallel_state.default_embedding_ranks(p) for p in groups["pp"]])


def test_enumeration_without_megatron() -> None:
    # Hand-checked: shape [2, 2, 2] (a fastest), dims a+b -> groups by c, ranks ascending.
    assert enumerate_grid([2, 2, 2], ["a", "b", "c"], ["b", "a"]) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert enumerate_grid([2, 2, 2], ["a", "b", "c"], ["b"]) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert enumerate_grid([2, 3], ["tp", "pp"], ["pp"], rank_offset=4) == [[4, 6, 8], [5, 7, 9]]
    with pytest.raises(ValueError, match="'x' is not a grid dim"):
        enumerate_grid([2], ["a"], ["x"])


def test_layout_module_does_not_import_torch() -> None:
    # Load the file on its own, so what the package __init__ may import does not count.
    code = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location("
        f"'layout_alone', {bridge_cudagraph.parallel.layout.__file__!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "sys.modules['layout_alone'] = module\n"
        "spec.loader.exec_module(module)\n"
        "print('torch' in sys.modules, 'numpy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.split() == ["False", "False"]


# --------------------------------------------------------------------------------------------------- vision


@pytest.mark.parametrize(
    ("world", "kw", "vision_tp"),
    [
        (1, {}, 1),
        (2, {"tp": 2}, 1),
        (2, {"tp": 2}, 2),
        (2, {"pp": 2}, 1),
        (4, {"tp": 2, "pp": 2}, 1),
        (8, {"tp": 2, "cp": 2, "pp": 2}, 4),
        (64, {"tp": 8, "pp": 4}, 2),
        (512, {"tp": 8, "cp": 2, "pp": 8, "ep": 8, "etp": 1}, 4),
    ],
)
def test_vision_sits_on_the_language_first_stage(world: int, kw: dict[str, int], vision_tp: int, world_env) -> None:
    language = ParallelLayout(**kw).resolve(world)
    vision = VisionLayout(tp=vision_tp).resolve(language)
    stage = world // language.pp
    assert (vision.tp, vision.cp, vision.pp, vision.ep, vision.etp) == (vision_tp, 1, 1, 1, vision_tp)
    assert vision.dp == vision.expt_dp == stage // vision_tp
    assert vision.name is Submodule.VISION and vision.rank_offset == 0 and vision.world_size == world
    # The claim behind rank_offset 0: pp is the outermost grid dim, so stage 0 is the first tp*cp*dp ranks,
    # i.e. exactly the first element of every pipeline group.
    first_of_each_pp_group = sorted(g[0] for g in rank_layout(language)["pp"])
    assert first_of_each_pp_group == list(range(stage)) == list(vision.ranks) == list(language.first_stage_ranks)

    groups = rank_layout(vision)
    for name, size in _expected_sizes(vision).items():
        assert sorted(x for g in groups[name] for x in g) == list(range(stage)), name
        assert {len(g) for g in groups[name]} == {size}, name
    # No experts: the expert groups mirror the dense ones.
    for expert_name, dense_name in [("ep", "cp"), ("expt_tp", "tp"), ("tp_ep", "tp"), ("expt_dp", "dp")]:
        assert groups[expert_name] == groups[dense_name]
    # A vision tp group never mixes ranks of different language tp x cp blocks (different batches).
    block = language.tp * language.cp
    assert all(len({x // block for x in g}) == 1 for g in groups["tp"])

    hyper_comm_grid = pytest.importorskip("megatron.core.hyper_comm_grid")
    world_env(world)
    grid = hyper_comm_grid.HyperCommGrid([vision_tp, 1, vision.dp, 1], ["tp", "cp", "dp", "pp"], 0)
    for name, (kind, dims) in GROUP_DIMS.items():
        if kind == "dense":
            assert groups[name] == grid.get_rank_enum(list(dims)), name


def test_vision_is_optional() -> None:
    resolved = resolve_submodules(ParallelLayout(tp=2), None, 4)
    assert list(resolved) == [Submodule.LANGUAGE]


def test_dim_names_match_bridge() -> None:
    assert DENSE_DIM_NAMES == ("tp", "cp", "dp", "pp")
    assert EXPERT_DIM_NAMES == ("tp", "ep", "dp", "pp")


# ----------------------------------------------------------------------------------------------- formatting


def test_format_layout_is_readable_and_elides() -> None:
    resolved = resolve_submodules(ParallelLayout(tp=8, cp=2, pp=8, ep=8, etp=1), VisionLayout(tp=2), 512)
    text = format_layout(resolved, max_groups=2)
    lines = text.splitlines()
    assert lines[0] == "language: ranks 0-511 of 512"
    assert "  dense  tp 8 x cp 2 x dp 4 x pp 8 = 512" in lines
    assert "  expert etp 1 x ep 8 x expt_dp 8 x pp 8 = 512" in lines
    assert "vision: ranks 0-63 of 512" in lines
    tp_line = next(line for line in lines if line.strip().startswith("tp "))
    assert tp_line.split()[:3] == ["tp", "8", "64"]
    assert tp_line.endswith("... (64 groups)")
    assert "(512 ranks)" in text  # long rank lists are shortened too
    assert max(len(line) for line in lines) <= 119
    # One row per group name per submodule.
    assert sum(line.strip().startswith("pos_embd ") for line in lines) == 2
    assert resolved[Submodule.VISION].describe(max_groups=2) in text


def test_format_layout_small_world_shows_everything() -> None:
    text = ParallelLayout(tp=2).resolve(2).describe()
    assert "..." not in text
    assert re.search(r"^  tp\s+2\s+1\s+\[0, 1\]$", text, re.M)


def test_format_layout_on_one_gpu_is_one_line() -> None:
    """On one GPU every group is that GPU: one line instead of 40 rows of size 1; two GPUs keep the tables."""
    one = resolve_submodules(ParallelLayout(), VisionLayout(tp=1), 1)
    assert format_layout(one) == "process groups: all of size 1 (one GPU; language, vision)"
    assert format_layout(ParallelLayout().resolve(1)) == "process groups: all of size 1 (one GPU; language)"
    two = format_layout(resolve_submodules(ParallelLayout(), VisionLayout(tp=1), 2))
    assert "process groups" not in two
    assert re.search(r"^  dp\s+2\s+1\s+\[0, 1\]$", two, re.M) and two.count("group           size") == 2
