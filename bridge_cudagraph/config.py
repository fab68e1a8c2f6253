"""The recipe flag: one nested ``cuda_graph`` block with a ``language`` and a ``vision`` part, and the parts of the
graphed step done this plugin's way (``forward``, ``cached_walks``).

These are *mutable* dataclasses on purpose: Megatron-Bridge applies YAML and Hydra-style overrides with a
recursive ``setattr`` (``omegaconf_utils._apply_overrides``), so the block must accept assignment. What the
user asked for lives here; what will actually be done (layers, static shapes, budgets, groups) is derived
from it by :mod:`bridge_cudagraph.plan`, which is pure and frozen.

Every field has an attribute docstring and a default that means "off" or "derive it" (``None``), never a
tuned number: a unit test walks ``dataclasses.fields`` and fails on an undocumented one.

Naming: classes are ``CudaGraph*``, fields ``cuda_graph*``; ``bridge_cudagraph`` is only the package name.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: Capture regions Megatron-Core's ``CudaGraphModule`` knows for transformer layers (megatron-core 0.19,
#: ``transformer/enums.py``). ``mamba`` is left out: neither GPT nor Qwen3-VL has Mamba layers.
GRAPHABLE_MODULES: tuple[str, ...] = ("attn", "mlp", "moe", "moe_router", "moe_preprocess")

#: What one graph may span (``graph_unit`` of either part): a run of layers that nothing outside them interrupts, cut
#: at each deepstack point where the model has one (:func:`bridge_cudagraph.plan.budgets.layer_segments`), or one
#: layer.
GRAPH_UNITS: tuple[str, ...] = ("run", "layer")


class CudaGraphConfigError(ValueError):
    """A ``cuda_graph`` setting that cannot work; the message names the setting and the fix.

    ``fix``: the ``key=value`` overrides of the first fix the message gives, where a refusal can say it exactly, and
    ``~key`` (Hydra's deletion) for a setting that no longer exists and must go; a test follows them from refusal to
    refusal until the configuration validates (no advice that runs in a circle).
    """

    def __init__(self, message: str, *, fix: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.fix: tuple[str, ...] = tuple(fix)


@dataclass
class SubmoduleGraphConfig:
    """Settings shared by the language and the vision part."""

    enabled: bool = False
    """Capture this submodule's transformer layers as per-layer CUDA graphs (Transformer Engine)."""

    modules: list[str] | None = None
    """Which part of each layer to capture: ``None`` whole layers (of an MoE layer: the attention alone, its router
    and experts eager after the graph). ``[attn]`` names that MoE scope; any other part of a layer is refused."""

    warmup_steps: int | None = None
    """Eager training steps before capture. ``None`` uses the model's ``cuda_graph_warmup_steps`` (3 in
    Megatron-Core), so both submodules are captured in the same step."""

    def _validate(self, where: str) -> None:
        if self.modules is not None:
            if isinstance(self.modules, str):
                raise CudaGraphConfigError(
                    f"{where}.modules must be a list, got the string {self.modules!r}; "
                    f"write [{self.modules}] (or null for whole layers)"
                )
            unknown = [m for m in self.modules if m not in GRAPHABLE_MODULES]
            if unknown:
                raise CudaGraphConfigError(
                    f"{where}.modules has unknown entries {unknown}; allowed: {list(GRAPHABLE_MODULES)} "
                    "(or null to capture whole layers)"
                )
            if len(set(self.modules)) != len(self.modules):
                raise CudaGraphConfigError(f"{where}.modules lists an entry twice: {self.modules}; list each once")
            if "moe" in self.modules and "moe_router" in self.modules:
                raise CudaGraphConfigError(
                    f"{where}.modules has both 'moe' and 'moe_router'; 'moe' already contains the router: keep one"
                )
            if "moe_preprocess" in self.modules and "moe_router" not in self.modules:
                raise CudaGraphConfigError(
                    f"{where}.modules has 'moe_preprocess' without 'moe_router'; add 'moe_router' "
                    "(Megatron-Core captures the preprocess step only together with the router)"
                )
            if not self.modules:
                raise CudaGraphConfigError(
                    f"{where}.modules is an empty list, which captures nothing; use null for whole layers "
                    f"or set {where}.enabled=false"
                )
        if self.warmup_steps is not None and (not isinstance(self.warmup_steps, int) or self.warmup_steps < 0):
            raise CudaGraphConfigError(
                f"{where}.warmup_steps must be an integer >= 0 (or null for the model's cuda_graph_warmup_steps), "
                f"got {self.warmup_steps!r}"
            )


def _check_positive_or_none(where: str, name: str, value: Any, meaning: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise CudaGraphConfigError(f"{where}.{name} must be an integer >= 1 (or null to {meaning}), got {value!r}")


def _check_budget_list(where: str, budgets: Any, unit: str) -> None:
    """The shape rules every budget list shares: non-empty, integers, positive, strictly ascending."""
    if budgets is None:
        return
    if not budgets or not all(isinstance(b, int) and not isinstance(b, bool) for b in budgets):
        raise CudaGraphConfigError(
            f"{where}.token_budgets must be a non-empty list of integers ({unit}), got {budgets!r}; "
            "or null to derive them"
        )
    if any(b <= 0 for b in budgets):
        raise CudaGraphConfigError(f"{where}.token_budgets must be positive, got {budgets}")
    if list(budgets) != sorted(set(budgets)):
        raise CudaGraphConfigError(
            f"{where}.token_budgets must be strictly ascending without repeats, got {budgets}; "
            f"write {sorted(set(budgets))}"
        )


def _check_graph_unit(where: str, unit: Any) -> None:
    if unit == "deepstack":
        raise CudaGraphConfigError(
            f"{where}.graph_unit='deepstack' was renamed: set {where}.graph_unit=run (a run of layers that nothing "
            "outside them interrupts, cut at each deepstack point where the model has one), or null",
            fix=(f"{where}.graph_unit=run",),
        )
    if unit is not None and unit not in GRAPH_UNITS:
        raise CudaGraphConfigError(
            f"{where}.graph_unit={unit!r}: use one of {list(GRAPH_UNITS)} (or null to choose from the model)"
        )


@dataclass
class LanguageGraphConfig(SubmoduleGraphConfig):
    """The language model's per-layer graphs."""

    token_budgets: list[int] | None = None
    """Packed (THD) micro-batches only: static token counts of the decoder input, ascending, one graph set per
    budget; a packed micro-batch replays in the smallest that holds it, one above the largest runs eagerly
    (counted). ``None`` derives a geometric ladder (rungs at most 1.25x apart) up to micro batch x ``seq_length``.
    Refused when every micro-batch is padded to ``seq_length`` (one static shape)."""

    max_sequences: int | None = None
    """Packed micro-batches only: most sequences (attention segments) one micro-batch may hold and replay, the
    static length of its ``cu_seqlens``. ``None``: the micro batch size (Bridge's Qwen3-VL step makes one
    segment per sample). Refused when every micro-batch is padded."""

    graph_unit: str | None = None
    """What one language graph spans: ``run``, a run of layers that nothing outside them interrupts (Qwen3-VL adds a
    deepstack feature after each of its first 3 layers: 4 graphs on its first stage instead of 28; a GPT stage: one),
    or ``layer``, one graph per layer (megatron-core's unit). Fewer graphs are fewer launches; both are bit-exact.
    ``None``: ``run`` for whole dense layers without per-layer quantization or offloading, else ``layer``."""

    tight_packing: bool | None = None
    """Packed Qwen3-VL micro-batches only: the replay runs each row's needed prefix, its padding tail dropped before
    the layers, at the budget of the rows' kept tokens (:mod:`bridge_cudagraph.capture.tight`). The rows' extents come
    from the forward's copies of the tokens on the CPU (``forward.positions``). ``None``: on where the plan can (the
    Qwen3-VL step's rows of varying width, pipeline parallel 1, no sequence parallelism, no MoE layers,
    ``forward.positions`` on); ``false``: every row replays at its full width; ``true`` where it cannot work is refused
    with the reason."""

    def validate(self, where: str = "cuda_graph.language") -> None:
        """Raise :class:`CudaGraphConfigError` on a contradiction inside this block."""
        self._validate(where)
        _check_graph_unit(where, self.graph_unit)
        if self.graph_unit == "run" and self.modules is not None:
            raise CudaGraphConfigError(
                f"{where}.graph_unit='run' with {where}.modules={self.modules}: a run of layers is captured "
                "from whole layers; set modules to null, or graph_unit to 'layer' (or null)"
            )
        _check_budget_list(where, self.token_budgets, "tokens")
        _check_positive_or_none(where, "max_sequences", self.max_sequences, "derive it")
        _check_switch(where, "tight_packing", self.tight_packing)
        if self.tight_packing and not self.enabled:
            raise CudaGraphConfigError(
                f"{where}.tight_packing=true packs the rows the language graphs replay, but {where}.enabled is false; "
                "set enabled to true, or leave tight_packing null",
                fix=(f"{where}.tight_packing=null",),
            )


@dataclass
class VisionGraphConfig(SubmoduleGraphConfig):
    """The vision encoder's per-layer graphs and its own process groups."""

    tensor_parallel_size: int = 1
    """Tensor-parallel size of the vision encoder, independent of the language model's. The vision encoder
    is small; 1 (replicated) avoids its all-reduces. It must divide the ranks of the language model's first
    pipeline stage and the vision attention heads."""

    token_budgets: list[int] | None = None
    """Static lengths, in *patches* (the unit the vision layers run on, before the 2x2 merge), one graph set
    per budget; a micro-batch uses the smallest budget that holds all its patches. ``None`` derives a geometric
    ladder (rungs multiples of 64 patches, at most 1.25x apart) up to micro batch x ``seq_length`` x
    ``spatial_merge_size**2`` (every token an image token), from a 64th of that. Must be sorted ascending and
    multiples of ``spatial_merge_size**2``."""

    max_images_per_microbatch: int | None = None
    """Upper bound on images in one micro-batch: the static length of the padded per-image ``cu_seqlens``
    captured with the graphs. ``None`` derives it from the budgets (the largest budget over the smallest
    image). A micro-batch with more images runs eagerly and is counted."""

    max_patches_per_image: int | None = None
    """Most patches of one image (one video frame) that replay: the static ``max_seqlen`` of the encoder's
    attention, whose workspaces grow with its square. ``None`` derives it from the data path: ``max_pixels //
    patch_size**2`` (3920 for Bridge's Qwen-VL collate, ``max_pixels`` 1003520; else the processor folder's
    ``size.longest_edge``), at most the largest budget, or the largest budget where the dataset names no processor
    (the plan says which). Above the largest budget it is refused. A larger image runs eagerly (counted)."""

    graph_unit: str | None = None
    """What one vision graph spans: ``run``, a run of layers up to and including each deepstack layer, then the rest
    (4 graphs per budget on Qwen3-VL's 24 layers), or ``layer``, one graph per layer per budget; both are bit-exact.
    A graph never spans a deepstack layer: its output would have consumers inside and outside the graph, and autograd
    would sum the gradient's parts in another order than eager does (``results/padded-levers/vision_unit_probe/``
    shows it). ``None``: ``run``."""

    def validate(self, where: str = "cuda_graph.vision") -> None:
        """Raise :class:`CudaGraphConfigError` on a contradiction inside this block."""
        self._validate(where)
        _check_graph_unit(where, self.graph_unit)
        if self.modules is not None:
            raise CudaGraphConfigError(
                f"{where}.modules={self.modules}: vision layers are captured whole (packed attention with per-image "
                "boundaries as static inputs, bridge_cudagraph.capture.vision); leave it null"
            )
        if not isinstance(self.tensor_parallel_size, int) or self.tensor_parallel_size < 1:
            raise CudaGraphConfigError(
                f"{where}.tensor_parallel_size must be an integer >= 1, got {self.tensor_parallel_size!r}"
            )
        _check_budget_list(where, self.token_budgets, "patches")
        _check_positive_or_none(where, "max_images_per_microbatch", self.max_images_per_microbatch, "derive it")
        _check_positive_or_none(where, "max_patches_per_image", self.max_patches_per_image, "allow any size")


def _check_switch(where: str, name: str, value: Any) -> None:
    if value is not None and not isinstance(value, bool):
        raise CudaGraphConfigError(f"{where}.{name} must be true, false or null (on where it can work), got {value!r}")


@dataclass
class ForwardConfig:
    """Qwen3-VL's forward without its waits for the GPU (:mod:`bridge_cudagraph.host.forward`): one setting per part
    that this plugin computes its own way, each the same values, bitwise, as Bridge's forward. Each is ``None``: on
    wherever graphs are on a Qwen3-VL model; ``false``: Bridge's own code for that part; ``true`` without graphs, or on
    a model without a vision encoder, is refused."""

    positions: bool | None = None
    """The mRoPE positions from Bridge's own ``get_rope_index`` on copies of the tokens, grids and sequence offsets
    on the CPU, enqueued at the forward's start and filled before the input embedding runs, instead of reading the
    GPU's tensors element by element. Its copies also give tight packing the rows' extents
    (``language.tight_packing``). ``None``: on wherever graphs are on a Qwen3-VL model; ``false``: Bridge's own."""

    merges: bool | None = None
    """The deepstack merges and the image-token merge written by row positions (``nonzero_static``, the count
    asserted on the device) instead of through a boolean mask, which waits forward and backward. ``None``: on wherever
    graphs are on a Qwen3-VL model; ``false``: Bridge's own."""

    flat_rows: bool | None = None
    """The Qwen3-VL step's packed rows handed to the forward already flat where Bridge's own repacking gives exactly
    that (every token kept by the step's attention mask, context parallelism off; a mask that drops tokens raises,
    naming this setting). It hands the forward the explicit positions ``positions`` derives. ``None``: on wherever
    graphs are on a Qwen3-VL model and ``positions`` is on; ``false``: Bridge's own; ``true`` with ``positions: false``
    is refused."""

    collated_grids: bool | None = None
    """The image and video grids read from the collated batch's copy on the CPU
    (:mod:`bridge_cudagraph.vision.cpu_grids`), bound to the device tensors the forward receives and checked on the
    device, instead of read back from the GPU by the graphed encoder and by ``positions``. ``None``: on wherever graphs
    are on a Qwen3-VL model; ``false``: read back."""

    def validate(self, where: str = "cuda_graph.forward") -> None:
        """Raise :class:`CudaGraphConfigError` on a contradiction inside this block."""
        for part in FORWARD_PARTS:
            _check_switch(where, part, getattr(self, part))
        if self.flat_rows and self.positions is False:
            raise CudaGraphConfigError(
                f"{where}.flat_rows=true hands the forward the rows flat with the explicit mRoPE positions that "
                f"{where}.positions derives, but {where}.positions is false; set {where}.positions to null (or true), "
                "or flat_rows to null",
                fix=(f"{where}.positions=null",),
            )


#: The parts of Qwen3-VL's forward, one setting each (:class:`ForwardConfig`).
FORWARD_PARTS: tuple[str, ...] = ("positions", "merges", "flat_rows", "collated_grids")


@dataclass
class CachedWalksConfig:
    """Per-step walks over the same objects, done once and kept instead of on every step: the same kernels on the same
    tensors, bitwise the same step, less Python while the GPU waits. Each is ``None``: on wherever graphs are;
    ``false``: megatron-core's own walk; ``true`` without graphs is refused."""

    optimizer: bool | None = None
    """The optimizer step's per-parameter walks (the main-gradient views, the norm's and the clip's gradient lists,
    Adam's tensor lists, the parameter copies: :mod:`bridge_cudagraph.host.optimizer`), kept until a DDP buffer is
    replaced. ``None``: on wherever graphs are; ``false``: megatron-core's own walks."""

    grad_finalize: bool | None = None
    """The module walk at the end of megatron-core's gradient finalisation (``reset_model_temporary_tensors`` over
    every module), listed once per model (:mod:`bridge_cudagraph.host.finalize`). ``None``: on wherever graphs are;
    ``false``: megatron-core's own walk."""

    def validate(self, where: str = "cuda_graph.cached_walks") -> None:
        """Raise :class:`CudaGraphConfigError` on a value that is not a switch."""
        for name in CACHED_WALKS:
            _check_switch(where, name, getattr(self, name))


#: The walks done once, one setting each (:class:`CachedWalksConfig`).
CACHED_WALKS: tuple[str, ...] = ("optimizer", "grad_finalize")


@dataclass
class CudaGraphConfig:
    """The ``model.cuda_graph`` block of a recipe."""

    language: LanguageGraphConfig = field(default_factory=LanguageGraphConfig)
    """Per-layer graphs of the language model (GPT-family decoder, or Qwen3-VL's language model)."""

    vision: VisionGraphConfig = field(default_factory=VisionGraphConfig)
    """Per-layer graphs and process groups of the vision encoder (Qwen3-VL only)."""

    forward: ForwardConfig = field(default_factory=ForwardConfig)
    """The parts of Qwen3-VL's forward computed without waiting for the GPU."""

    cached_walks: CachedWalksConfig = field(default_factory=CachedWalksConfig)
    """The step's per-step walks done once."""

    num_microbatches: int | None = None
    """Micro-batches per step, for the capture schedule under pipeline parallelism. ``None`` derives it
    from the training config (global batch / (micro batch x data parallel)) instead of reading
    Megatron's global micro-batch calculator."""

    on_capture_error: str = "eager"
    """What a failed capture does: ``eager`` logs one warning with the cause and trains on without graphs;
    ``raise`` stops the run."""

    @property
    def any_enabled(self) -> bool:
        """Whether either submodule asks for graphs."""
        return self.language.enabled or self.vision.enabled

    def validate(self, where: str = "cuda_graph") -> None:
        """Raise :class:`CudaGraphConfigError` on a contradiction inside the block (model-independent checks).

        Checks that need the model or the world size (heads, merge size, group sizes) live in
        :func:`bridge_cudagraph.plan.build.build_plan`.
        """
        for old in RENAMED_SETTINGS:  # set on the block in Python (or by Bridge's setattr), past the loader
            if old in vars(self):
                refuse_renamed(old, vars(self)[old], where)
        for name, cls in SUB_BLOCKS.items():
            if not isinstance(getattr(self, name), cls):
                raise CudaGraphConfigError(
                    f"{where}.{name} must be a mapping of its settings, got {type(getattr(self, name)).__name__} "
                    "(build the block with cuda_graph_config_from_dict)"
                )
        self.language.validate(f"{where}.language")
        self.vision.validate(f"{where}.vision")
        self.forward.validate(f"{where}.forward")
        self.cached_walks.validate(f"{where}.cached_walks")
        if self.num_microbatches is not None and (
            not isinstance(self.num_microbatches, int) or self.num_microbatches < 1
        ):
            raise CudaGraphConfigError(
                f"{where}.num_microbatches must be an integer >= 1 (or null to derive it), "
                f"got {self.num_microbatches!r}"
            )
        switches: list[tuple[str, object, str]] = [(f"forward.{p}", self.forward, p) for p in FORWARD_PARTS]
        switches += [(f"cached_walks.{w}", self.cached_walks, w) for w in CACHED_WALKS]
        for path, block, name in switches:
            if getattr(block, name) and not self.any_enabled:
                raise CudaGraphConfigError(
                    f"{where}.{path}=true changes the graphed step, but no graphs are enabled; set "
                    f"{where}.language.enabled or {where}.vision.enabled to true, or leave it null",
                    fix=(f"{where}.{path}=null",),
                )
        if self.on_capture_error not in ("eager", "raise"):
            raise CudaGraphConfigError(
                f"{where}.on_capture_error must be 'eager' or 'raise', got {self.on_capture_error!r}"
            )


#: The block's parts that are blocks of their own, by field name.
SUB_BLOCKS: dict[str, type] = {
    "language": LanguageGraphConfig,
    "vision": VisionGraphConfig,
    "forward": ForwardConfig,
    "cached_walks": CachedWalksConfig,
}


# ------------------------------------------------------------------------------------------ renamed settings
#: Settings of ``model.cuda_graph`` that were split: old name -> (the new settings, relative to the block, and what
#: their ``false`` does). Each is refused with its new names wherever it is given (the YAML, an override, Python).
RENAMED_SETTINGS: dict[str, tuple[tuple[str, ...], str]] = {
    "fewer_host_waits": (
        tuple(f"forward.{part}" for part in FORWARD_PARTS),
        "false: Bridge's own code for that part; the tight packing it also turned off is language.tight_packing",
    ),
    "optimizer_host_cache": (
        tuple(f"cached_walks.{walk}" for walk in CACHED_WALKS),
        "false: megatron-core's own walk",
    ),
}


def refuse_renamed(key: str, value: Any, where: str) -> None:
    """Raise :class:`CudaGraphConfigError` naming the new settings where ``key`` is a renamed setting of the block
    at ``where``; return otherwise. Its fix deletes the old key and, for ``false``, turns each new setting off (what
    the old one did); else the new ones' ``null`` is the old default."""
    if key not in RENAMED_SETTINGS:
        return
    settings, meaning = RENAMED_SETTINGS[key]
    paths = [f"{where}.{s}" for s in settings]
    if value is False:
        advice = f"delete it and set {', '.join(f'{p}=false' for p in paths)}"
        fix = (f"~{where}.{key}", *(f"{p}=false" for p in paths))
    else:
        advice = f"delete it (null: each on where it can work), or set {', '.join(paths)}"
        fix = (f"~{where}.{key}",)
    raise CudaGraphConfigError(
        f"{where}.{key} was split into one setting per mechanism: {advice} ({meaning})", fix=fix
    )


def cuda_graph_config_from_dict(data: dict[str, Any] | None, where: str = "cuda_graph") -> CudaGraphConfig:
    """Build a :class:`CudaGraphConfig` from a plain mapping (a YAML block), strictly.

    Unknown keys are an error that names the nearest valid key (Bridge itself would only log and skip them),
    and values of the wrong type are reported with their setting path.
    """
    if data is not None and not isinstance(data, Mapping):
        raise CudaGraphConfigError(
            f"{where} must be a mapping of settings ({where}: {{language: {{enabled: true}}}}), "
            f"got {type(data).__name__} {data!r}"
        )
    data = dict(data or {})
    check_keys(data, CudaGraphConfig, where)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key in SUB_BLOCKS:
            sub_cls = SUB_BLOCKS[key]
            if value is None:
                value = {}
            if not isinstance(value, Mapping):
                raise CudaGraphConfigError(
                    f"{where}.{key} must be a mapping of settings, got {type(value).__name__} {value!r}"
                )
            check_keys(value, sub_cls, f"{where}.{key}")
            kwargs[key] = sub_cls(**_coerced(value, sub_cls, f"{where}.{key}"))
        else:
            kwargs[key] = value
    cfg = CudaGraphConfig(**_coerced(kwargs, CudaGraphConfig, where, skip=tuple(SUB_BLOCKS)))
    cfg.validate(where)
    return cfg


def _coerced(values: Mapping[str, Any], cls: type, where: str, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Check scalar types of a block's values (YAML gives ``"3"`` or ``yes`` where an int or bool is meant)."""
    out = dict(values)
    types = {f.name: f.type for f in dataclasses.fields(cls)}
    for key, value in values.items():
        if key in skip or value is None:
            continue
        expected = str(types[key])
        if expected == "bool" and not isinstance(value, bool):
            raise CudaGraphConfigError(f"{where}.{key} must be true or false, got {value!r}")
        if expected.startswith("int") and (isinstance(value, bool) or not isinstance(value, int)):
            raise CudaGraphConfigError(f"{where}.{key} must be an integer, got {type(value).__name__} {value!r}")
        if expected.startswith("list") and not isinstance(value, list | tuple):
            raise CudaGraphConfigError(f"{where}.{key} must be a list, got {type(value).__name__} {value!r}")
        if isinstance(value, tuple):
            out[key] = list(value)
    return out


def cuda_graph_config_to_dict(cfg: CudaGraphConfig) -> dict[str, Any]:
    """The block as a plain mapping (for printing, YAML dumps and the plan)."""
    return dataclasses.asdict(cfg)


# ------------------------------------------------------------------------------------------ strict keys
# Megatron-Bridge's own loader logs ``Key 'x' ... not found ... Skipping`` and drops a misspelt key, so a typo such as
# ``token_budget`` silently runs a different job. Ours refuses it before anything is applied.
class UnknownKeyError(KeyError):
    """A key that the target dataclass does not have; ``str()`` gives the readable message."""

    def __str__(self) -> str:
        return str(self.args[0])


def valid_keys(target: Any) -> list[str]:
    """Settable names of a dataclass (class or instance): its fields, public or not."""
    if dataclasses.is_dataclass(target):
        return [f.name for f in dataclasses.fields(target)]
    raise TypeError(f"{target!r} is not a dataclass")


def suggest(key: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest candidate, or an empty string."""
    close = difflib.get_close_matches(key, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


#: Past this many valid keys (a model provider has ~340) the message names the count instead of listing them.
MAX_LISTED_KEYS = 12


def unknown_key_message(key: str, allowed: Iterable[str], where: str) -> str:
    """``unknown setting where.key (did you mean 'x'?); valid keys of where: ...``, kept to one line."""
    allowed = list(allowed)
    path = f"{where}.{key}" if where else str(key)
    public = sorted(k for k in allowed if not k.startswith("_"))
    listed = ", ".join(public) if len(public) <= MAX_LISTED_KEYS else f"{len(public)} settings"
    return f"unknown setting {path}{suggest(str(key), allowed)}; valid keys of {where or 'the recipe'}: {listed}"


def check_keys(data: Mapping[str, Any], target: Any, where: str, extra: Iterable[str] = ()) -> None:
    """Raise :class:`UnknownKeyError` for the first key of ``data`` that ``target`` does not have, or
    :class:`CudaGraphConfigError` with the new names where it is a renamed setting of the block
    (:func:`refuse_renamed_key`)."""
    allowed = [*valid_keys(target), *extra]
    for key, value in data.items():
        if key not in allowed:
            refuse_renamed_key(target, str(key), value, where)
            raise UnknownKeyError(unknown_key_message(str(key), allowed, where))


def refuse_renamed_key(target: Any, key: str, value: Any, where: str) -> None:
    """Where ``target`` (a dataclass or its class) is the ``model.cuda_graph`` block and ``key`` a setting it no longer
    has under that name, raise the refusal that names the new ones (:func:`refuse_renamed`); return otherwise."""
    cls = target if isinstance(target, type) else type(target)
    if cls is CudaGraphConfig:
        refuse_renamed(key, value, where)
