"""The recipe flag: one nested ``cuda_graph`` block with a ``language`` and a ``vision`` part.

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

#: What one graph may span (``graph_unit`` of either part): a run of layers cut at each deepstack point
#: (:func:`bridge_cudagraph.plan.budgets.layer_segments`), or one layer.
GRAPH_UNITS: tuple[str, ...] = ("deepstack", "layer")


class CudaGraphConfigError(ValueError):
    """A ``cuda_graph`` setting that cannot work; the message names the setting and the fix.

    ``fix``: the ``key=value`` overrides of the first fix the message gives, where a refusal can say it exactly; a
    test follows them from refusal to refusal until the configuration validates (no advice that runs in a circle).
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
    """Which part of each layer to capture: ``None`` captures whole layers; otherwise a subset of
    ``attn``, ``mlp``, ``moe``, ``moe_router``, ``moe_preprocess`` (Megatron-Core's ``CudaGraphModule``)."""

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
    """What one language graph spans: ``deepstack``, a run of layers that nothing outside them interrupts (Qwen3-VL
    adds a deepstack feature after each of its first 3 layers: 4 graphs on its first stage instead of 28; a GPT
    stage: one), or ``layer``, one graph per layer (megatron-core's unit). Fewer graphs are fewer launches; both are
    bit-exact. ``None``: ``deepstack`` for whole dense layers without per-layer quantization or offloading, else
    ``layer``."""

    def validate(self, where: str = "cuda_graph.language") -> None:
        """Raise :class:`CudaGraphConfigError` on a contradiction inside this block."""
        self._validate(where)
        _check_graph_unit(where, self.graph_unit)
        if self.graph_unit == "deepstack" and self.modules is not None:
            raise CudaGraphConfigError(
                f"{where}.graph_unit='deepstack' with {where}.modules={self.modules}: a run of layers is captured "
                "from whole layers; set modules to null, or graph_unit to 'layer' (or null)"
            )
        _check_budget_list(where, self.token_budgets, "tokens")
        _check_positive_or_none(where, "max_sequences", self.max_sequences, "derive it")


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
    """What one vision graph spans: ``deepstack``, the layers up to and including each deepstack layer, then the
    rest (4 graphs per budget on Qwen3-VL's 24 layers), or ``layer``, one graph per layer per budget; both are
    bit-exact. A graph never spans a deepstack layer: its output would have consumers inside and outside the graph,
    and autograd would sum the gradient's parts in another order than eager does (``benchmarks/vision_unit_probe.py``
    shows it). ``None``: ``deepstack``."""

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


@dataclass
class CudaGraphConfig:
    """The ``model.cuda_graph`` block of a recipe."""

    language: LanguageGraphConfig = field(default_factory=LanguageGraphConfig)
    """Per-layer graphs of the language model (GPT-family decoder, or Qwen3-VL's language model)."""

    vision: VisionGraphConfig = field(default_factory=VisionGraphConfig)
    """Per-layer graphs and process groups of the vision encoder (Qwen3-VL only)."""

    num_microbatches: int | None = None
    """Micro-batches per step, for the capture schedule under pipeline parallelism. ``None`` derives it
    from the training config (global batch / (micro batch x data parallel)) instead of reading
    Megatron's global micro-batch calculator."""

    on_capture_error: str = "eager"
    """What a failed capture does: ``eager`` logs one warning with the cause and trains on without graphs;
    ``raise`` stops the run."""

    optimizer_host_cache: bool | None = None
    """Do the optimizer step's per-parameter host work and the gradient finalisation's module walk once instead of
    on every step (:mod:`bridge_cudagraph.host.step`): the same kernels, bitwise the same step, less Python while the
    GPU waits. ``None``: on wherever graphs are; ``false``: megatron-core's step as it is; ``true`` without graphs is
    refused."""

    fewer_host_waits: bool | None = None
    """Qwen3-VL's forward without most of its waits for the GPU (:mod:`bridge_cudagraph.host.forward`): the mRoPE
    positions from Bridge's own ``get_rope_index`` on one host copy of the tokens and grids, the deepstack and
    image-token merges by row positions instead of boolean masks, and the Qwen3-VL step's packed rows handed to the
    forward already flat where its own repacking gives exactly that (every token kept by the step's attention mask,
    context parallelism off; a mask that drops tokens raises, naming this setting), and the image grids from the
    collated batch's host copy (:mod:`bridge_cudagraph.vision.host_grids`); the same values, bitwise. Its
    host copies also give the packed rows' lengths to tight packing (:mod:`bridge_cudagraph.capture.tight`).
    ``None``: on wherever graphs are on a Qwen3-VL model; ``false``: Bridge's forward as it is, and no tight packing;
    ``true`` without graphs, or on a model without a vision encoder, is refused."""

    @property
    def any_enabled(self) -> bool:
        """Whether either submodule asks for graphs."""
        return self.language.enabled or self.vision.enabled

    def validate(self, where: str = "cuda_graph") -> None:
        """Raise :class:`CudaGraphConfigError` on a contradiction inside the block (model-independent checks).

        Checks that need the model or the world size (heads, merge size, group sizes) live in
        :func:`bridge_cudagraph.plan.build.build_plan`.
        """
        if not isinstance(self.language, LanguageGraphConfig) or not isinstance(self.vision, VisionGraphConfig):
            raise CudaGraphConfigError(
                f"{where}.language / {where}.vision must be mappings of their settings "
                "(build the block with cuda_graph_config_from_dict)"
            )
        self.language.validate(f"{where}.language")
        self.vision.validate(f"{where}.vision")
        if self.num_microbatches is not None and (
            not isinstance(self.num_microbatches, int) or self.num_microbatches < 1
        ):
            raise CudaGraphConfigError(
                f"{where}.num_microbatches must be an integer >= 1 (or null to derive it), "
                f"got {self.num_microbatches!r}"
            )
        for name, what in (
            ("optimizer_host_cache", "caches the graphed step's optimizer work"),
            ("fewer_host_waits", "takes the graphed step's forward off the host's waits"),
        ):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise CudaGraphConfigError(
                    f"{where}.{name} must be true, false or null (on wherever graphs are), got {value!r}"
                )
            if value and not self.any_enabled:
                raise CudaGraphConfigError(
                    f"{where}.{name}=true {what}, but no graphs are enabled; set {where}.language.enabled or "
                    f"{where}.vision.enabled to true, or leave it null",
                    fix=(f"{where}.{name}=null",),
                )
        if self.on_capture_error not in ("eager", "raise"):
            raise CudaGraphConfigError(
                f"{where}.on_capture_error must be 'eager' or 'raise', got {self.on_capture_error!r}"
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
        if key in ("language", "vision"):
            sub_cls = LanguageGraphConfig if key == "language" else VisionGraphConfig
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
    cfg = CudaGraphConfig(**_coerced(kwargs, CudaGraphConfig, where, skip=("language", "vision")))
    cfg.validate(where)
    return cfg


def _coerced(values: dict[str, Any], cls: type, where: str, skip: tuple[str, ...] = ()) -> dict[str, Any]:
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
    """Raise :class:`UnknownKeyError` for the first key of ``data`` that ``target`` does not have."""
    allowed = [*valid_keys(target), *extra]
    for key in data:
        if key not in allowed:
            raise UnknownKeyError(unknown_key_message(str(key), allowed, where))
