"""Parallel layouts of the language model and the vision encoder, as plain integers.

This module decides *which ranks form which process group* for each submodule, without creating any group and
without importing torch. It exists so that a bad layout is rejected with its arithmetic before any collective call
is made (a half-built set of NCCL communicators cannot be rolled back), and so that the CLI can print the rank layout
of a run on a laptop.

The enumeration reproduces megatron-core's ``HyperCommGrid`` exactly, on the two grids Megatron-Bridge builds in
``_create_pg_collection`` (``megatron/bridge/training/initialize.py``):

* the dense grid, shape ``[tp, cp, dp, pp]`` with dim names ``["tp", "cp", "dp", "pp"]``;
* the expert grid, shape ``[etp, ep, expt_dp, pp]`` with dim names ``["tp", "ep", "dp", "pp"]``.

``HyperCommGrid`` reverses the dim names to build a C-ordered rank tensor, so the *first* dim varies fastest
(``tp`` ranks are adjacent) and the *last* one slowest (``pp`` is the outermost dim). Consequently the first pipeline
stage of the language model is the contiguous block ``[offset, offset + tp * cp * dp)``, which is where the vision
encoder lives: its grid is ``[vision_tp, 1, vision_dp, 1]`` at the same rank offset.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "DENSE_DIM_NAMES",
    "EXPERT_DIM_NAMES",
    "GROUP_DIMS",
    "LayoutError",
    "ParallelLayout",
    "ResolvedLayout",
    "Submodule",
    "VisionLayout",
    "check_vision_heads",
    "enumerate_grid",
    "format_layout",
    "rank_layout",
    "resolve_submodules",
]


class Submodule(StrEnum):
    """Names of the submodules that get their own process groups.

    The values are the keys of the ``MultiModuleProcessGroupCollection`` built by ``bridge_cudagraph.parallel.groups``
    and the prefixes of every error message, so a user can tell which half of a VLM a bad setting belongs to.
    """

    LANGUAGE = "language"
    VISION = "vision"


class LayoutError(ValueError):
    """A parallel layout that cannot be placed on the given number of ranks.

    Subclasses ``ValueError`` so callers that validate configs generically still catch it. Every message states the
    arithmetic that failed and the setting to change.
    """


# Dim names of the two grids, in HyperCommGrid order (first = fastest varying), as Megatron-Bridge builds them.
DENSE_DIM_NAMES: tuple[str, ...] = ("tp", "cp", "dp", "pp")
EXPERT_DIM_NAMES: tuple[str, ...] = ("tp", "ep", "dp", "pp")

# Group name -> (grid, dims). ``grid`` is "dense" or "expert"; the dims are the grid dims the group spans.
# The names follow ``ProcessGroupCollection`` fields, plus ``tp_dp`` (read by the TE graph helper for FP8 amax
# reduction, but not a declared field) and ``intra_dist_opt`` (all tp-ep-pp ranks of one optimizer instance; with a
# single instance, the whole grid, as ``parallel_state`` builds it).
GROUP_DIMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "tp": ("dense", ("tp",)),
    "cp": ("dense", ("cp",)),
    "pp": ("dense", ("pp",)),
    "dp": ("dense", ("dp",)),
    "mp": ("dense", ("tp", "pp")),
    "tp_cp": ("dense", ("tp", "cp")),
    "tp_dp_cp": ("dense", ("tp", "dp", "cp")),
    "dp_cp": ("dense", ("dp", "cp")),
    "tp_dp": ("dense", ("tp", "dp")),
    "ep": ("expert", ("ep",)),
    "expt_tp": ("expert", ("tp",)),
    "tp_ep": ("expert", ("tp", "ep")),
    "tp_ep_pp": ("expert", ("tp", "ep", "pp")),
    "expt_dp": ("expert", ("dp",)),
    "intra_dist_opt": ("expert", ("tp", "ep", "dp", "pp")),
}

# Width of the CLI table; rank lists beyond it are elided.
_LINE_WIDTH = 119

# Groups derived from the pipeline groups rather than from a grid dim (see ``rank_layout``).
EMBEDDING_GROUPS: tuple[str, ...] = ("embd", "pos_embd")


def _check_positive(name: str, **sizes: int | None) -> None:
    """Reject sizes that are not positive ints, before any arithmetic uses them."""
    for key, value in sizes.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise LayoutError(f"{name} {key} must be a positive integer, got {value!r}")


@dataclass(frozen=True, slots=True)
class ResolvedLayout:
    """A validated layout: every size known, placed on ``[rank_offset, rank_offset + size)`` of ``world_size`` ranks.

    Built by :meth:`ParallelLayout.resolve` or :meth:`VisionLayout.resolve`; the pure source of truth that
    ``bridge_cudagraph.parallel.groups`` turns into process groups, so that what the CLI prints and what is built
    cannot disagree.

    Attributes:
        name: The submodule this layout belongs to; prefixes error messages and group descriptions.
        world_size: Number of ranks in the whole job (the grid may cover only part of it).
        tp: Tensor-parallel size.
        cp: Context-parallel size.
        dp: Data-parallel size (without cp).
        pp: Pipeline-parallel size.
        ep: Expert-parallel size.
        etp: Expert tensor-parallel size.
        expt_dp: Expert data-parallel size; folds cp into dp, as megatron-core's expert rank generator does.
        rank_offset: First global rank of the grid.
    """

    name: Submodule
    world_size: int
    tp: int
    cp: int
    dp: int
    pp: int
    ep: int
    etp: int
    expt_dp: int
    rank_offset: int = 0

    def __post_init__(self) -> None:
        # Guard direct construction too (groups.derive_vision_collection builds one from group sizes), so the two
        # grids always cover the same ranks and fit in the world.
        _check_positive(
            self.name,
            world_size=self.world_size,
            tp=self.tp,
            cp=self.cp,
            dp=self.dp,
            pp=self.pp,
            ep=self.ep,
            etp=self.etp,
            expt_dp=self.expt_dp,
        )
        if self.rank_offset < 0:
            raise LayoutError(f"{self.name} rank offset must be >= 0, got {self.rank_offset}")
        expert_size = self.etp * self.ep * self.expt_dp * self.pp
        if expert_size != self.size:
            raise LayoutError(
                f"{self.name} expert grid etp {self.etp} x ep {self.ep} x expt_dp {self.expt_dp} x pp {self.pp} = "
                f"{expert_size} != dense grid tp {self.tp} x cp {self.cp} x dp {self.dp} x pp {self.pp} = "
                f"{self.size} (both grids must cover the same ranks)"
            )
        if self.rank_offset + self.size > self.world_size:
            raise LayoutError(
                f"{self.name} grid of {self.size} ranks at offset {self.rank_offset} ends at rank "
                f"{self.rank_offset + self.size - 1}, beyond world size {self.world_size}"
            )

    @property
    def size(self) -> int:
        """Number of ranks the grid covers."""
        return self.tp * self.cp * self.dp * self.pp

    @property
    def stage_size(self) -> int:
        """Number of ranks in one pipeline stage (``tp * cp * dp``)."""
        return self.tp * self.cp * self.dp

    @property
    def ranks(self) -> range:
        """Global ranks of the grid."""
        return range(self.rank_offset, self.rank_offset + self.size)

    @property
    def first_stage_ranks(self) -> range:
        """Global ranks of pipeline stage 0: contiguous because ``pp`` is the outermost grid dim."""
        return range(self.rank_offset, self.rank_offset + self.stage_size)

    @property
    def dense_shape(self) -> list[int]:
        """``HyperCommGrid`` shape of the dense grid (dims :data:`DENSE_DIM_NAMES`)."""
        return [self.tp, self.cp, self.dp, self.pp]

    @property
    def expert_shape(self) -> list[int]:
        """``HyperCommGrid`` shape of the expert grid (dims :data:`EXPERT_DIM_NAMES`)."""
        return [self.etp, self.ep, self.expt_dp, self.pp]

    def contains(self, rank: int) -> bool:
        """Whether global ``rank`` belongs to this grid."""
        return rank in self.ranks

    def describe(self, *, max_groups: int = 3) -> str:
        """Readable multi-line table of this layout; see :func:`format_layout`."""
        return _describe_one(self, max_groups=max_groups)


@dataclass(frozen=True, slots=True)
class ParallelLayout:
    """Parallel sizes of the language model (or any submodule that spans the whole world).

    Attributes:
        tp: Tensor-parallel size.
        cp: Context-parallel size.
        pp: Pipeline-parallel size.
        ep: Expert-parallel size (1 for a dense model).
        etp: Expert tensor-parallel size; ``None`` means "same as ``tp``", megatron-core's default. Note that
            Megatron-Bridge's configs instead set it to 1 when ``ep > 1`` and it is unset
            (``_set_moe_expert_tensor_parallel_default``), so callers reading a Bridge provider should pass the
            provider's resolved ``expert_tensor_parallel_size`` explicitly.
        dp: Data-parallel size; ``None`` derives it from the world size. Given explicitly, it is checked, which
            catches a recipe written for a different number of GPUs.
    """

    tp: int = 1
    cp: int = 1
    pp: int = 1
    ep: int = 1
    etp: int | None = None
    dp: int | None = None

    def resolve(self, world_size: int, *, name: Submodule = Submodule.LANGUAGE) -> ResolvedLayout:
        """Validate against ``world_size`` ranks and derive ``dp`` and the expert data-parallel size.

        Megatron requires ``tp * cp * pp`` to divide the world (the rest is dp) and, separately, ``etp * ep * pp``
        to divide it (the rest is expert dp, which absorbs cp). It does not require ``dp * cp`` to be divisible by
        ``ep``, so neither do we.

        Args:
            world_size: Number of ranks the grid spans.
            name: Submodule name used in error messages.

        Returns:
            The resolved layout, at rank offset 0.

        Raises:
            LayoutError: A size is not a positive integer, or a product does not divide the world size, or an
                explicit ``dp`` disagrees with the world size.
        """
        name = Submodule(name)
        _check_positive(name, tp=self.tp, cp=self.cp, pp=self.pp, ep=self.ep, etp=self.etp, dp=self.dp)
        _check_positive(name, world_size=world_size)
        model = self.tp * self.cp * self.pp
        if world_size % model != 0:
            raise LayoutError(
                f"{name} tp {self.tp} x cp {self.cp} x pp {self.pp} = {model} does not divide world size "
                f"{world_size} (set tp/cp/pp so their product divides the number of GPUs)"
            )
        dp = world_size // model
        if self.dp is not None and self.dp != dp:
            raise LayoutError(
                f"{name} tp {self.tp} x cp {self.cp} x dp {self.dp} x pp {self.pp} = {model * self.dp} != world "
                f"size {world_size} (world size {world_size} / {model} gives dp {dp}; leave dp unset to derive it)"
            )
        etp = self.tp if self.etp is None else self.etp
        expert_model = etp * self.ep * self.pp
        if world_size % expert_model != 0:
            raise LayoutError(
                f"{name} expert etp {etp} x ep {self.ep} x pp {self.pp} = {expert_model} does not divide world size "
                f"{world_size} (set etp/ep so etp x ep x pp divides the number of GPUs)"
            )
        return ResolvedLayout(
            name=name,
            world_size=world_size,
            tp=self.tp,
            cp=self.cp,
            dp=dp,
            pp=self.pp,
            ep=self.ep,
            etp=etp,
            expt_dp=world_size // expert_model,
            rank_offset=0,
        )


def check_vision_heads(tp: int, heads: int) -> None:
    """Vision tp must divide the encoder's attention heads: the one copy of this check, reached by the plan, the
    provider's ``finalize()`` and the group derivation (:meth:`VisionLayout.resolve`).

    Raises:
        LayoutError: It does not, with the divisors to choose from.
    """
    name = Submodule.VISION
    _check_positive(name, tp=tp, num_attention_heads=heads)
    if heads % tp:
        divisors = [d for d in range(1, heads + 1) if heads % d == 0]
        raise LayoutError(
            f"{name} tp {tp} does not divide the {heads} attention heads of the {name} encoder "
            f"({heads} % {tp} = {heads % tp}) (set {name} tp, model.cuda_graph.vision.tensor_parallel_size, to a "
            f"divisor of {heads}: one of {divisors})"
        )


@dataclass(frozen=True, slots=True)
class VisionLayout:
    """Parallel sizes of the vision encoder, placed on the language model's first pipeline stage.

    The vision encoder runs only where the language model's embedding runs (stage 0), with its own tensor-parallel
    size and no cp/pp/ep. Its data-parallel group is every other rank of that stage: ``vision dp = stage ranks /
    vision tp``. Ranks of the stage that share a language batch hold identical vision inputs, so averaging vision
    gradients over them is exact.

    Attributes:
        tp: Vision tensor-parallel size (1 by default: the encoder is small and replicating it avoids collectives
            inside its graphs).
        num_attention_heads: The encoder's attention heads, when known; vision tp must divide it.
        vision_dp_when_cp: Mirrors the Qwen3-VL provider flag of the same name: when True, the language cp ranks
            split the images between them, so a vision tp group may not span cp ranks.
    """

    tp: int = 1
    num_attention_heads: int | None = None
    vision_dp_when_cp: bool = False

    def resolve(self, language: ResolvedLayout) -> ResolvedLayout:
        """Place the encoder on ``language``'s first pipeline stage and derive its data-parallel size.

        Args:
            language: The resolved language layout.

        Returns:
            The resolved vision layout (``cp = pp = ep = 1``, ``etp = tp``, ``expt_dp = dp``) at the language grid's
            rank offset.

        Raises:
            LayoutError: Vision tp is not a positive integer, does not divide the ranks of the language first stage
                or the encoder's attention heads, or would span ranks that hold different images.
        """
        name = Submodule.VISION
        _check_positive(name, tp=self.tp, num_attention_heads=self.num_attention_heads)
        stage = language.stage_size
        if stage % self.tp != 0:
            raise LayoutError(
                f"{name} tp {self.tp} does not divide the {stage} ranks of the {language.name} first pipeline stage "
                f"({language.name} tp {language.tp} x cp {language.cp} x dp {language.dp} = {stage}; "
                f"{stage} % {self.tp} = {stage % self.tp}) (set {name} tp to a divisor of {stage})"
            )
        if self.num_attention_heads is not None:
            check_vision_heads(self.tp, self.num_attention_heads)
        # A tp group must see identical activations. Vision tp groups are blocks of ``tp`` adjacent ranks; the ranks
        # that share a language batch (and so its images) are the adjacent blocks of ``tp * cp`` ranks, or only of
        # ``tp`` ranks when cp ranks split the images between them.
        if self.vision_dp_when_cp:
            same_input, what = language.tp, f"{language.name} tp {language.tp}"
        else:
            same_input = language.tp * language.cp
            what = f"{language.name} tp {language.tp} x cp {language.cp} = {same_input}"
        if same_input % self.tp != 0:
            raise LayoutError(
                f"{name} tp {self.tp} does not divide {what}: its groups would span ranks that hold different "
                f"images (set {name} tp to a divisor of {same_input})"
            )
        dp = stage // self.tp
        return ResolvedLayout(
            name=name,
            world_size=language.world_size,
            tp=self.tp,
            cp=1,
            dp=dp,
            pp=1,
            ep=1,
            etp=self.tp,
            expt_dp=dp,
            rank_offset=language.rank_offset,
        )


def resolve_submodules(
    language: ParallelLayout, vision: VisionLayout | None, world_size: int
) -> dict[Submodule, ResolvedLayout]:
    """Resolve the language layout and, when given, the vision layout on its first stage.

    Everything is validated before returning, so callers can build groups knowing no layout error can occur
    half-way through.

    Args:
        language: Language model sizes.
        vision: Vision encoder sizes, or ``None`` for a text-only model.
        world_size: Number of ranks in the job.

    Returns:
        ``{Submodule.LANGUAGE: ..., Submodule.VISION: ...}``, the vision entry only when ``vision`` is given.
    """
    resolved = {Submodule.LANGUAGE: language.resolve(world_size, name=Submodule.LANGUAGE)}
    if vision is not None:
        resolved[Submodule.VISION] = vision.resolve(resolved[Submodule.LANGUAGE])
    return resolved


def enumerate_grid(
    shape: list[int] | tuple[int, ...],
    dim_names: list[str] | tuple[str, ...],
    dims: list[str] | tuple[str, ...],
    rank_offset: int = 0,
) -> list[list[int]]:
    """Rank lists of the groups spanning ``dims``, in the order ``HyperCommGrid.create_pg(dims)`` creates them.

    ``HyperCommGrid`` lays ranks out with ``dim_names[0]`` varying fastest. A group fixes every other dim; groups
    are listed with the *last* fixed dim varying slowest, and ranks inside a group are ascending (``create_pg``
    sorts the requested dims by grid position, so the order in which ``dims`` is given does not matter).

    Args:
        shape: Size of each dim.
        dim_names: Name of each dim, fastest first.
        dims: The dims the groups span.
        rank_offset: First global rank of the grid.

    Returns:
        One rank list per group.
    """
    if len(shape) != len(dim_names):
        raise ValueError(f"len(shape) {list(shape)} != len(dim_names) {list(dim_names)}")
    unknown = [d for d in dims if d not in dim_names]
    if unknown:
        raise ValueError(f"{unknown[0]!r} is not a grid dim {list(dim_names)}")
    strides = [math.prod(shape[:i]) for i in range(len(shape))]
    inside = [i for i, d in enumerate(dim_names) if d in dims]
    outside = [i for i, d in enumerate(dim_names) if d not in dims]
    # Outermost dim first, so the fastest-varying one changes last in itertools.product.
    inside_offsets = sorted(
        sum(idx * strides[i] for idx, i in zip(combo, inside, strict=True))
        for combo in itertools.product(*(range(shape[i]) for i in inside))
    )
    groups = []
    for combo in itertools.product(*(range(shape[i]) for i in reversed(outside))):
        base = rank_offset + sum(idx * strides[i] for idx, i in zip(combo, reversed(outside), strict=True))
        groups.append([base + off for off in inside_offsets])
    return groups


def rank_layout(layout: ResolvedLayout) -> dict[str, list[list[int]]]:
    """Every group of ``layout``: group name -> rank lists, exactly as ``bridge_cudagraph.parallel.groups`` creates
    them.

    Grid groups follow :data:`GROUP_DIMS`. ``embd`` holds the first and last rank of each pipeline group (one rank
    when ``pp == 1``) and ``pos_embd`` the first, Megatron-Bridge's defaults.

    Args:
        layout: A resolved layout.

    Returns:
        Group name -> list of rank lists, one per group, in creation order.
    """
    grids = {
        "dense": (layout.dense_shape, DENSE_DIM_NAMES),
        "expert": (layout.expert_shape, EXPERT_DIM_NAMES),
    }
    out: dict[str, list[list[int]]] = {}
    for group, (grid, dims) in GROUP_DIMS.items():
        shape, names = grids[grid]
        out[group] = enumerate_grid(shape, names, dims, layout.rank_offset)
    out["embd"] = [[ranks[0]] if len(ranks) == 1 else [ranks[0], ranks[-1]] for ranks in out["pp"]]
    out["pos_embd"] = [[ranks[0]] for ranks in out["pp"]]
    return out


def _elide(groups: list[list[int]], max_groups: int, width: int) -> str:
    """Render the first rank lists, then a count, so a 512-rank table stays one short line per group name.

    Shows at most ``max_groups`` lists, fewer when they would not fit in ``width`` characters (always at least one).
    """
    shown: list[str] = []
    for i, group in enumerate(groups[:max_groups]):
        text = _short_ranks(group)
        more = f" ... ({len(groups)} groups)" if len(groups) > i + 1 else ""
        if shown and len(" ".join([*shown, text])) + len(more) > width:
            break
        shown.append(text)
    out = " ".join(shown)
    if len(groups) > len(shown):
        out += f" ... ({len(groups)} groups)"
    return out


def _short_ranks(ranks: list[int], max_ranks: int = 8) -> str:
    """Render one rank list, eliding the middle of long ones."""
    if len(ranks) <= max_ranks:
        return "[" + ", ".join(map(str, ranks)) + "]"
    return f"[{ranks[0]}, {ranks[1]}, {ranks[2]}, ..., {ranks[-1]}] ({len(ranks)} ranks)"


def _describe_one(layout: ResolvedLayout, *, max_groups: int) -> str:
    last = layout.rank_offset + layout.size - 1
    lines = [
        f"{layout.name}: ranks {layout.rank_offset}-{last} of {layout.world_size}",
        f"  dense  tp {layout.tp} x cp {layout.cp} x dp {layout.dp} x pp {layout.pp} = {layout.size}",
        f"  expert etp {layout.etp} x ep {layout.ep} x expt_dp {layout.expt_dp} x pp {layout.pp} = {layout.size}",
    ]
    groups = rank_layout(layout)
    name_width = max(len(n) for n in groups)
    lines.append(f"  {'group':<{name_width}}  size  count  ranks")
    for group, ranks in groups.items():
        prefix = f"  {group:<{name_width}}  {len(ranks[0]):>4}  {len(ranks):>5}  "
        lines.append(prefix + _elide(ranks, max_groups, _LINE_WIDTH - len(prefix)))
    return "\n".join(lines)


def format_layout(
    layouts: ResolvedLayout | dict[Submodule, ResolvedLayout] | list[ResolvedLayout], *, max_groups: int = 3
) -> str:
    """Readable table of one or more resolved layouts, for the CLI.

    Each submodule gets its sizes and, per group name, the group size, the number of groups and the first
    ``max_groups`` rank lists (long lists are elided with ``... (N groups)``). On one GPU, where every group is that
    GPU alone, one line says so instead.

    Args:
        layouts: A layout, a list of them, or the dict returned by :func:`resolve_submodules`.
        max_groups: How many rank lists to show per group name.

    Returns:
        The table, without a trailing newline.
    """
    if isinstance(layouts, ResolvedLayout):
        items = [layouts]
    elif isinstance(layouts, dict):
        items = list(layouts.values())
    else:
        items = list(layouts)
    if items and all(layout.world_size == 1 for layout in items):
        names = ", ".join(layout.name for layout in items)
        return f"process groups: all of size 1 (one GPU; {names})"
    return "\n".join(_describe_one(layout, max_groups=max_groups) for layout in items)
