"""The strict recipe loader: a Bridge recipe function, then the YAML file, then ``key=value`` overrides.

A recipe file names a Megatron-Bridge recipe function and lays settings over the ``ConfigContainer`` it
returns (schema: ``recipes/README.md``)::

    description: "Qwen3-VL 8B SFT with language and vision graphs"
    recipe: qwen3_vl_8b_sft_config              # in megatron.bridge.recipes, or "pkg.module:function"
    hf_config: hf_configs/Qwen--Qwen3-VL-8B-Instruct   # optional, relative to this file
    world_size: 8                               # default GPU count for `bridge-cudagraph plan`
    model: {tensor_model_parallel_size: 2, cuda_graph: {language: {enabled: true}}}
    train: {global_batch_size: 128}

Precedence, lowest first: the recipe function < the YAML file < the command line. Values travel through
Bridge's own override path (``megatron.bridge.training.utils.omegaconf_utils``: the config as an OmegaConf
tree, ``OmegaConf.merge`` with the YAML, Hydra's parser for the command line, then ``apply_overrides``),
exactly as ``scripts/training/run_recipe.py`` does. What we add comes *before* that path: every key of the
YAML and of the command line is checked against the ConfigContainer's dataclasses, because Bridge only logs
``Key '...' not found ... Skipping`` for an unknown YAML key, so a typo would silently run another job.
Unknown keys raise :class:`~bridge_cudagraph.config.UnknownKeyError` with the nearest valid name, scalar
values of the wrong type raise :class:`RecipeError`, and the ``model.cuda_graph`` block is checked by
:func:`~bridge_cudagraph.config.cuda_graph_config_from_dict`.

Offline: with ``hf_config`` Bridge's Hub reads are answered from the committed ``config.json``
(:mod:`bridge_cudagraph.recipe.offline`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge_cudagraph.config import UnknownKeyError, refuse_renamed_key, suggest, unknown_key_message
from bridge_cudagraph.recipe import RecipeError
from bridge_cudagraph.recipe.offline import recipe_environment

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer


__all__ = [
    "META_KEYS",
    "LoadedRecipe",
    "RecipeError",
    "check_override_syntax",
    "check_recipe_file",
    "load_recipe",
    "resolve_recipe_function",
]

#: Keys of a recipe file that are not ConfigContainer sections.
META_KEYS: tuple[str, ...] = ("description", "recipe", "hf_config", "world_size")

# Where ``recipe: name`` (no module) is looked up: Bridge's recipe package re-exports every recipe function.
_BRIDGE_RECIPES = "megatron.bridge.recipes"
_CUDA_GRAPH_PATH = ("model", "cuda_graph")


@dataclass(frozen=True, slots=True)
class LoadedRecipe:
    """A recipe with every override applied, ready for ``finalize()``, planning or training.

    Attributes:
        config: The Bridge ``ConfigContainer``; ``config.model`` is the graph-enabled provider.
        world_size: The file's default GPU count (``world_size:``), or None when it sets none.
        source: The recipe file.
        description: The file's ``description:`` (empty when absent).
        recipe: The recipe function it started from, as written in the file.
        overrides: The command-line ``key=value`` overrides, in the order applied.
    """

    config: ConfigContainer
    world_size: int | None
    source: Path
    description: str
    recipe: str
    overrides: tuple[str, ...] = ()

    def world(self, world_size: int | None = None) -> int:
        """The ranks to plan for: ``world_size`` when given (``--world-size``), else the file's ``world_size:``.

        Raises:
            RecipeError: Neither gives one.
        """
        world = world_size if world_size is not None else self.world_size
        if world is None:
            raise RecipeError(f"{self.source} sets no world_size; pass --world-size N")
        return world


# --------------------------------------------------------------------------------------- entry point
def load_recipe(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> LoadedRecipe:
    """Load a recipe file: recipe function < YAML < ``overrides``, every key checked strictly.

    Args:
        path: The recipe YAML.
        overrides: Hydra-style ``key=value`` strings (``model.cuda_graph.vision.token_budgets=[1024,4096]``).

    Returns:
        The loaded recipe; its provider is not finalized yet.

    Raises:
        RecipeError: The file, its recipe function, a value's type or an override is wrong.
        UnknownKeyError: A key that the ConfigContainer does not have (with the nearest valid name).
        CudaGraphConfigError: The merged ``model.cuda_graph`` block contradicts itself.
    """
    from omegaconf import OmegaConf

    source = check_recipe_file(path)
    try:
        loaded: Any = OmegaConf.to_container(OmegaConf.load(source), resolve=False)
    except Exception as error:  # yaml or OmegaConf syntax error: one line is enough
        raise RecipeError(f"{source}: not valid YAML: {error}".replace("\n", " ")) from error
    if not isinstance(loaded, dict):
        raise RecipeError(f"{source}: a recipe file is a mapping of keys (recipe:, model:, train: ...)")
    meta = {k: loaded.pop(k) for k in META_KEYS if k in loaded}
    spec = meta.get("recipe")
    if not isinstance(spec, str) or not spec:
        raise RecipeError(f"{source}: 'recipe:' must name a Bridge recipe function, e.g. qwen3_vl_8b_sft_config")
    world_size = meta.get("world_size")
    if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1):
        raise RecipeError(f"{source}: world_size must be a positive integer, got {world_size!r}")
    description = meta.get("description") or ""
    overrides = tuple(overrides)

    function = resolve_recipe_function(spec)  # imports the recipe's module (and its config classes), runs nothing
    _check_structure(loaded)  # before the recipe function, which may reach the Hugging Face Hub
    hf_dir = meta.get("hf_config")
    with recipe_environment(None if hf_dir is None else source.parent / str(hf_dir)):
        cfg = _call_recipe(function, spec)
    if not (dataclasses.is_dataclass(cfg) and hasattr(cfg, "model")):
        raise RecipeError(f"recipe {spec} returned {type(cfg).__name__}, not a Bridge ConfigContainer")

    from bridge_cudagraph.bridge.providers import with_cuda_graphs

    cfg.model = with_cuda_graphs(cfg.model)
    _check_top_level(loaded, cfg)
    for key, value in loaded.items():
        _check_entry(cfg, key, value, "")
    parsed = _parse_overrides(overrides)
    for override in parsed:
        _check_override(cfg, override)
    _apply_through_bridge(cfg, loaded, list(overrides))
    return LoadedRecipe(
        config=cfg,
        world_size=world_size,
        source=source,
        description=str(description),
        recipe=spec,
        overrides=overrides,
    )


def _call_recipe(function: Callable[[], Any], spec: str) -> Any:
    """The recipe function's config; what it raises, as one line naming the function (its cause chained): a function
    that needs arguments, or one that fails for a reason of its own (a cache folder it cannot write, a file it cannot
    read), is a configuration the user can change, not a traceback."""
    import inspect

    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        signature = None
    required = [
        p.name
        for p in (signature.parameters.values() if signature is not None else ())
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    if required:
        raise RecipeError(
            f"recipe {spec} needs arguments ({', '.join(required)}), but a recipe file calls it with none; name a "
            "function that builds the whole config (wrap this one in a function of your own, e.g. "
            "recipe: my_pkg.my_recipes:my_config)"
        )
    try:
        return function()
    except (RecipeError, UnknownKeyError):
        raise
    except Exception as error:
        cause = " ".join(f"{type(error).__name__}: {error}".split())
        raise RecipeError(f"recipe {spec} failed: {cause}") from error


def check_recipe_file(path: str | os.PathLike[str]) -> Path:
    """The recipe file as a path, or :class:`RecipeError` when there is no such file (the CLI asks before it imports
    anything heavy)."""
    source = Path(path)
    if not source.is_file():
        raise RecipeError(f"recipe file {source} does not exist")
    return source


def resolve_recipe_function(spec: str) -> Callable[[], Any]:
    """The recipe function ``spec`` names: ``name`` in ``megatron.bridge.recipes`` or ``pkg.module:function``.

    Raises:
        RecipeError: The module or function does not exist (with the nearest recipe name).
    """
    module_name, _, name = spec.rpartition(":") if ":" in spec else (_BRIDGE_RECIPES, ":", spec)
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        hint = ""
        if module_name == _BRIDGE_RECIPES:
            # It imports every model family: flux needs diffusers, the quantization recipes nvidia-modelopt.
            hint = "; megatron.bridge.recipes imports every model family: install the missing package"
        raise RecipeError(f"recipe {spec}: cannot import {module_name} ({error}){hint}") from error
    function = getattr(module, name, None)
    if not callable(function):
        names = [n for n in dir(module) if n.endswith("_config") and callable(getattr(module, n))]
        raise RecipeError(f"recipe {spec}: {module_name} has no recipe function {name!r}{suggest(name, names)}")
    return function


# ------------------------------------------------------------------------------------- strict checks
@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """Resolved field annotations of a dataclass, or nothing when they cannot be resolved (then no type checks)."""
    try:
        return typing.get_type_hints(cls)
    except Exception:
        return {}


def _field_names(obj: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(obj)]


def _check_top_level(data: Mapping[str, Any], cfg: Any) -> None:
    allowed = [*_field_names(cfg), *META_KEYS]
    for key in data:
        if key not in allowed:
            raise UnknownKeyError(unknown_key_message(str(key), allowed, ""))


def _options(annotation: Any) -> tuple[list[type], list[Any], bool]:
    """An annotation's dataclass options, its other options, and whether it allows ``None``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = list(typing.get_args(annotation))
    else:
        args = [annotation]
    nullable = type(None) in args
    args = [a for a in args if a is not type(None)]
    classes = [a for a in args if isinstance(a, type) and dataclasses.is_dataclass(a)]
    return classes, [a for a in args if a not in classes], nullable


def _family_fields(classes: Sequence[type]) -> set[str]:
    """Field names of ``classes`` and of every subclass imported so far (a recipe may return any of them)."""
    names: set[str] = set()
    stack, seen = list(classes), set()
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        if dataclasses.is_dataclass(cls):
            names.update(f.name for f in dataclasses.fields(cls))
        stack.extend(cls.__subclasses__())
    return names


def _check_structure(data: Mapping[str, Any]) -> None:
    """The recipe file's own shape, judged from the ``ConfigContainer`` *classes*, before the recipe function runs.

    The function may take minutes or try the Hugging Face Hub (Bridge retries an unreachable Hub for ~100 s), so what
    the classes alone can tell is told first: an unknown section or key of a section (against the fields of the
    section's classes and all their subclasses, since the function may return any of them), a section that must be a
    mapping but is not, a required section left empty, and the whole ``model.cuda_graph`` block (our own class). What
    depends on the instance the function returns is checked again after it, by :func:`_check_entry`.
    """
    from megatron.bridge.training.config import ConfigContainer

    from bridge_cudagraph.config import cuda_graph_config_from_dict

    hints = _type_hints(ConfigContainer)
    sections = _family_fields([ConfigContainer])
    allowed = sorted(sections - {"_checkpoint_load_required"}) + list(META_KEYS)
    for key in data:
        if key not in allowed:
            raise UnknownKeyError(unknown_key_message(str(key), allowed, ""))
    for key, value in data.items():
        classes, others, nullable = _options(hints.get(key))
        if value is None:
            if classes and not nullable:
                raise RecipeError(
                    f"{key} is empty in the recipe file; give it settings ({key}: {{name: value}}) or delete the line"
                )
            continue
        if not isinstance(value, Mapping):
            if classes and not others:
                raise RecipeError(
                    f"{key} must be a mapping of settings ({key}: {{name: value}}), "
                    f"got {type(value).__name__} {value!r}"
                )
            continue
        if not classes or "_target_" in value:
            continue
        fields = _family_fields(classes) | ({_CUDA_GRAPH_PATH[1]} if key == _CUDA_GRAPH_PATH[0] else set())
        for sub_key in value:
            if sub_key not in fields:
                raise UnknownKeyError(unknown_key_message(str(sub_key), sorted(fields), str(key)))
        if key == _CUDA_GRAPH_PATH[0] and value.get(_CUDA_GRAPH_PATH[1]) is not None:
            cuda_graph_config_from_dict(value[_CUDA_GRAPH_PATH[1]], ".".join(_CUDA_GRAPH_PATH))


def _dataclass_option(annotation: Any) -> type | None:
    """The one dataclass type an annotation allows (``X | None`` -> X), else None."""
    options = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    classes = [a for a in options if isinstance(a, type) and dataclasses.is_dataclass(a)]
    return classes[0] if len(classes) == 1 else None


def _materialize(obj: Any, key: str, path: str, given: Mapping[str, Any]) -> Any:
    """Give a ``None`` sub-config an instance so the settings laid over it land on a dataclass.

    Bridge would merge a mapping into ``None`` and ``setattr`` a plain dict onto the config. The instance is
    built from the class defaults plus the required arguments found among the ``given`` settings.
    """
    owner: type = type(obj)  # annotated: mypy takes type[Any] for unhashable (functools.cache)
    cls = _dataclass_option(_type_hints(owner).get(key))
    if cls is None:
        raise RecipeError(f"{path} is null in the recipe and takes no block of settings; set it to a value")
    required = {
        f.name
        for f in dataclasses.fields(cls)
        if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    missing = sorted(required - set(given))
    if missing:
        raise RecipeError(
            f"{path} is null in the recipe; to set {', '.join(map(str, given))} give its required "
            f"setting{'s' if len(missing) > 1 else ''} too: {', '.join(f'{path}.{m}' for m in missing)}"
        )
    instance = cls(**{k: given[k] for k in required})
    setattr(obj, key, instance)
    return instance


def _is_cuda_graph_path(path: str) -> bool:
    return path == ".".join(_CUDA_GRAPH_PATH) or path.startswith(".".join(_CUDA_GRAPH_PATH) + ".")


def _check_entry(obj: Any, key: Any, value: Any, where: str) -> None:
    """Check ``key: value`` laid over ``obj`` (a dataclass or a free-form dict) and what is nested in it."""
    path = f"{where}.{key}" if where else str(key)
    if isinstance(obj, dict) or not dataclasses.is_dataclass(obj):
        return  # free-form mapping (env_vars, dataset_kwargs...): Bridge takes any key
    allowed = _field_names(obj)
    if key not in allowed:
        refuse_renamed_key(obj, str(key), value, where)
        raise UnknownKeyError(unknown_key_message(str(key), allowed, where))
    current = getattr(obj, key)
    owner: type = type(obj)  # annotated: mypy takes a dataclass type for unhashable (functools.cache)
    if path == ".".join(_CUDA_GRAPH_PATH) and value is not None:
        from bridge_cudagraph.config import cuda_graph_config_from_dict

        cuda_graph_config_from_dict(value, path)  # keys, types and contradictions, with setting paths
        return
    classes, others, _ = _options(_type_hints(owner).get(key))
    if value is not None and not isinstance(value, Mapping) and classes and not others:
        raise RecipeError(
            f"{path} is a block of settings: give a mapping ({key}: {{name: value}} in the file, {path}.name=value "
            f"on the command line), got {type(value).__name__} {value!r}"
        )
    if isinstance(value, Mapping) and "_target_" not in value:
        _check_mapping_onto(obj, key, current, value, path)
        return
    if not _is_cuda_graph_path(path):
        _check_type(path, value, _type_hints(owner).get(key))


def _check_mapping_onto(obj: Any, key: str, current: Any, value: Mapping[str, Any], path: str) -> None:
    if current is None:
        current = _materialize(obj, key, path, value)
    if dataclasses.is_dataclass(current):
        for sub_key, sub_value in value.items():
            _check_entry(current, sub_key, sub_value, path)
        return
    if _is_hf_config(current):
        # Bridge turns HF configs into {_target_, _call_, config_dict}; only config_dict is settable.
        for sub_key in value:
            if sub_key != "config_dict":
                raise UnknownKeyError(unknown_key_message(str(sub_key), ["config_dict"], path))
        return
    if isinstance(current, dict):
        return
    raise RecipeError(
        f"{path} is {type(current).__name__} {current!r} in the recipe, not a block of settings; "
        "give a value of that kind, or a full block with _target_"
    )


def _is_hf_config(value: Any) -> bool:
    return any(c.__name__ in ("PretrainedConfig", "GenerationConfig") for c in type(value).__mro__)


_SIMPLE = (bool, int, float, str)


def _check_type(path: str, value: Any, annotation: Any) -> None:
    """Refuse a scalar whose type the field cannot hold (Bridge would ``setattr`` it silently).

    Checks only what the annotation states plainly (bool, int, float, str, Literal, list and their
    ``| None``); anything richer (dtypes, enums, paths, unions with classes) is left to Bridge.
    """
    if annotation is None or value is None or (isinstance(value, str) and "${" in value):
        return
    options = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        options = [annotation]
    literals = [a for a in options if typing.get_origin(a) is typing.Literal]
    plain = [a for a in options if a in _SIMPLE or typing.get_origin(a) is list or a is list]
    if len(plain) + len(literals) != len(options):
        return  # a class, dtype, enum, Path, Any...: not ours to judge
    for option in plain:
        if option is bool and isinstance(value, bool):
            return
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return
        if option is float and isinstance(value, int | float) and not isinstance(value, bool):
            return
        if option is str and isinstance(value, str):
            return
        if (option is list or typing.get_origin(option) is list) and isinstance(value, list | tuple):
            return
    allowed = [v for lit in literals for v in typing.get_args(lit)]
    if value in allowed and type(value) in {type(v) for v in allowed}:
        return
    wanted = " or ".join([getattr(o, "__name__", str(o)) for o in plain] + ([f"one of {allowed}"] if allowed else []))
    hint = suggest(value, [str(a) for a in allowed]) if isinstance(value, str) and allowed else ""
    raise RecipeError(f"{path} must be {wanted}, got {type(value).__name__} {value!r}{hint}")


# ------------------------------------------------------------------------------------- CLI overrides
#: What Hydra's override grammar lets a key hold (``OverrideLexer.g4``, key mode: ``ID``, ``DOT_PATH``,
#: ``KEY_SPECIAL``, ``@package``), besides ASCII letters and digits; ``~`` and ``+`` only as a prefix.
_KEY_PUNCTUATION = frozenset("_-$./@")


def check_override_syntax(overrides: Sequence[str]) -> list[Any]:
    """Refuse, in one line and before Megatron-Bridge is imported (Hydra's parser alone takes a fraction of a second),
    what is wrong with the command line's overrides as text: an override without ``=``, a key with a character the
    grammar does not allow (named, with its column, and the key as plain ASCII where that is one), a value Hydra's
    grammar cannot parse (``model.seq_length=[1,``), a sweep. Returns Hydra's parse."""
    import unicodedata

    for text in overrides:
        if "=" not in text and not text.startswith("~"):
            raise RecipeError(f"override {text!r} is not key=value (e.g. model.seq_length=4096)")
        key = text.split("=", 1)[0]
        body = key.lstrip("~+")
        start = len(key) - len(body)
        for column, char in enumerate(body, start=start + 1):
            if (char.isascii() and char.isalnum()) or char in _KEY_PUNCTUATION:
                continue
            name = unicodedata.name(char, "")
            ascii_key = unicodedata.normalize("NFKD", body).encode("ascii", "ignore").decode()
            fix = "use ASCII letters, digits, '_', '-' and dots"
            if ascii_key != body and all((c.isascii() and c.isalnum()) or c in _KEY_PUNCTUATION for c in ascii_key):
                fix = f"did you mean {key[:start]}{ascii_key}?"
            code = f"U+{ord(char):04X}" + (f" {name}" if name else "")
            raise RecipeError(
                f"override {text!r}: the key has {char!r} ({code}) at column {column}, which a setting's name "
                f"cannot hold; {fix}"
            )
    return _hydra_parse(overrides)


def _hydra_parse(overrides: Sequence[str]) -> list[Any]:
    """Hydra's parse of the ``key=value`` strings (the parser Bridge's ``parse_hydra_overrides`` uses), one override
    at a time so that a refusal names the one that is wrong."""
    if not overrides:
        return []
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    parsed = []
    for text in overrides:
        try:
            (override,) = parser.parse_overrides(overrides=[text])
        except Exception as error:
            reason = " ".join(str(error).split("See https://")[0].split())
            raise RecipeError(
                f"override {text!r} is not valid override syntax ({reason}); quote lists and strings as Hydra reads "
                "them, e.g. 'model.cuda_graph.vision.token_budgets=[1024,4096]'"
            ) from error
        if override.is_sweep_override():
            raise RecipeError(f"override {text!r} is a sweep; give one value per key")
        parsed.append(override)
    return parsed


def _parse_overrides(overrides: Sequence[str]) -> list[Any]:
    """The command line's overrides, checked (:func:`check_override_syntax`) and parsed."""
    return check_override_syntax(overrides)


def _check_override(cfg: Any, override: Any) -> None:
    key = override.key_or_group
    parts = key.split(".")
    if parts[0] in META_KEYS:
        raise RecipeError(
            f"{parts[0]} is a key of the recipe file, not of the config: edit the file"
            + (" or pass --world-size" if parts[0] == "world_size" else "")
        )
    obj, where = cfg, ""
    for part in parts[:-1]:
        if isinstance(obj, dict) or not dataclasses.is_dataclass(obj):
            return  # inside a free-form mapping
        allowed = _field_names(obj)
        if part not in allowed:
            raise UnknownKeyError(unknown_key_message(part, allowed, where))
        nxt = getattr(obj, part)
        where = f"{where}.{part}" if where else part
        if nxt is None:
            rest = parts[len(where.split(".")) :]
            given = {rest[0]: override.value()} if len(rest) == 1 and not override.is_delete() else {}
            nxt = _materialize(obj, part, where, given)
        obj = nxt
    if override.is_delete():
        _refuse_deletion(key)
    if where == "" and parts[-1] not in _field_names(obj):
        raise UnknownKeyError(unknown_key_message(parts[-1], [*_field_names(obj), *META_KEYS], ""))
    _check_entry(obj, parts[-1], override.value(), where)


def _refuse_deletion(key: str) -> typing.NoReturn:
    """``~key`` on a setting of the ``ConfigContainer``'s dataclasses: Hydra deletes it from the tree Bridge builds,
    and Bridge then keeps the recipe's value without a word (a dataclass field cannot be removed). Refused, with what
    the user most likely meant."""
    if key == ".".join(_CUDA_GRAPH_PATH) or _is_cuda_graph_path(key):
        meant = (
            "to train without graphs set model.cuda_graph.language.enabled=false and "
            "model.cuda_graph.vision.enabled=false"
        )
    else:
        meant = f"set it instead ({key}=null clears it, where the setting takes null)"
    raise RecipeError(
        f"override '~{key}' deletes {key}, a setting of the config that cannot be removed (Bridge would keep the "
        f"recipe's value); {meant}"
    )


def _apply_through_bridge(cfg: Any, yaml_sections: dict[str, Any], overrides: list[str]) -> None:
    """Bridge's own override path, in its own order: OmegaConf tree < YAML merge < Hydra overrides."""
    from megatron.bridge.training.utils.omegaconf_utils import (
        OverridesError,
        apply_overrides,
        create_omegaconf_dict_config,
        parse_hydra_overrides,
    )
    from omegaconf import OmegaConf

    from bridge_cudagraph.config import cuda_graph_config_from_dict

    tree, excluded = create_omegaconf_dict_config(cfg)
    if yaml_sections:
        tree = OmegaConf.merge(tree, OmegaConf.create(yaml_sections))
    if overrides:
        try:
            tree = parse_hydra_overrides(tree, overrides)
        except OverridesError as error:
            raise RecipeError(str(error).replace("\n", " ")) from error
    final: Any = OmegaConf.to_container(tree, resolve=True)
    # The merged block as a whole: a CLI value laid over a YAML one can only be judged together.
    block = cuda_graph_config_from_dict(final["model"]["cuda_graph"], "model.cuda_graph")
    apply_overrides(cfg, final, excluded)
    cfg.model.cuda_graph = block
