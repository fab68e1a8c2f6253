"""``bridge_cudagraph.config``: defaults that mean "off" or "derive it", a docstring on every field, and every
error that ``validate()`` and ``cuda_graph_config_from_dict`` can raise, each with the setting's path."""

from __future__ import annotations

import ast
import dataclasses
import inspect

import pytest

import bridge_cudagraph.config as config_module
from bridge_cudagraph.config import (
    CACHED_WALKS,
    FORWARD_PARTS,
    GRAPHABLE_MODULES,
    CachedWalksConfig,
    CudaGraphConfig,
    CudaGraphConfigError,
    ForwardConfig,
    LanguageGraphConfig,
    UnknownKeyError,
    VisionGraphConfig,
    cuda_graph_config_from_dict,
    cuda_graph_config_to_dict,
)

pytestmark = pytest.mark.fast

CONFIG_CLASSES = [
    c
    for _, c in inspect.getmembers(config_module, inspect.isclass)
    if dataclasses.is_dataclass(c) and c.__module__ == config_module.__name__
]


def _attribute_docstrings() -> dict[str, set[str]]:
    """Class name -> fields declared in its body that are followed by a string (an attribute docstring)."""
    tree = ast.parse(inspect.getsource(config_module))
    out: dict[str, set[str]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        documented = out.setdefault(node.name, set())
        for stmt, after in zip(node.body, [*node.body[1:], None], strict=True):
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                if (
                    isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)
                    and after.value.value.strip()
                ):
                    documented.add(stmt.target.id)
    return out


class TestDefaults:
    def test_the_block_is_off_and_derives_everything(self):
        """A default block captures nothing and leaves every size to be derived (None), never a tuned number."""
        cfg = CudaGraphConfig()
        assert not cfg.any_enabled
        assert (cfg.language.enabled, cfg.vision.enabled) == (False, False)
        assert cfg.language.modules is None and cfg.vision.modules is None
        assert cfg.language.warmup_steps is None and cfg.vision.warmup_steps is None
        assert cfg.vision.token_budgets is None and cfg.vision.max_images_per_microbatch is None
        assert cfg.num_microbatches is None
        assert cfg.vision.tensor_parallel_size == 1
        assert cfg.on_capture_error == "eager"
        cfg.validate()

    def test_from_dict_of_nothing_equals_the_defaults(self):
        """An empty or missing YAML block is the default block."""
        assert cuda_graph_config_from_dict(None) == CudaGraphConfig()
        assert cuda_graph_config_from_dict({}) == CudaGraphConfig()
        assert cuda_graph_config_from_dict({"language": None}) == CudaGraphConfig()

    def test_round_trip_through_a_dict(self):
        """``to_dict`` and ``from_dict`` are inverse (the YAML form of a block)."""
        cfg = cuda_graph_config_from_dict(
            {
                "language": {"enabled": True, "modules": ["attn"], "warmup_steps": 2},
                "vision": {"enabled": True, "token_budgets": [1024, 4096], "max_images_per_microbatch": 8},
                "num_microbatches": 4,
                "on_capture_error": "raise",
            }
        )
        assert cuda_graph_config_from_dict(cuda_graph_config_to_dict(cfg)) == cfg

    def test_blocks_are_mutable_for_bridge_overrides(self):
        """Bridge's ``_apply_overrides`` uses ``setattr``: the blocks must not be frozen."""
        cfg = CudaGraphConfig()
        cfg.vision.token_budgets = [1024]
        cfg.language.enabled = True
        assert cfg.any_enabled


class TestFieldDocs:
    def test_every_field_of_every_block_has_an_attribute_docstring(self):
        """Each field (inherited ones included) has a string right under it, in the class that declares it."""
        docs = _attribute_docstrings()
        assert {c.__name__ for c in CONFIG_CLASSES} >= {
            "SubmoduleGraphConfig",
            "LanguageGraphConfig",
            "VisionGraphConfig",
            "ForwardConfig",
            "CachedWalksConfig",
            "CudaGraphConfig",
        }
        missing = []
        for cls in CONFIG_CLASSES:
            for field in dataclasses.fields(cls):
                owners = [k for k in cls.__mro__ if field.name in getattr(k, "__annotations__", {})]
                if not any(field.name in docs.get(k.__name__, set()) for k in owners):
                    missing.append(f"{cls.__name__}.{field.name}")
        assert not missing, f"fields without an attribute docstring: {missing}"

    def test_every_class_has_a_docstring(self):
        """The blocks explain themselves (ruff D101 checks presence; this checks non-empty)."""
        for cls in CONFIG_CLASSES:
            assert (cls.__doc__ or "").strip(), cls.__name__


# (block dict, error type, fragments the message must contain)
ERRORS = [
    ({"language": {"modules": "attn"}}, CudaGraphConfigError, ["cuda_graph.language.modules must be a list"]),
    ({"language": {"modules": ["attention"]}}, CudaGraphConfigError, ["unknown entries ['attention']", "allowed"]),
    ({"language": {"modules": ["attn", "attn"]}}, CudaGraphConfigError, ["lists an entry twice"]),
    ({"language": {"modules": ["moe", "moe_router"]}}, CudaGraphConfigError, ["both 'moe' and 'moe_router'"]),
    ({"language": {"modules": ["moe_preprocess"]}}, CudaGraphConfigError, ["without 'moe_router'"]),
    ({"language": {"modules": []}}, CudaGraphConfigError, ["empty list", "null for whole layers"]),
    ({"language": {"warmup_steps": -1}}, CudaGraphConfigError, ["cuda_graph.language.warmup_steps", ">= 0"]),
    ({"vision": {"warmup_steps": 1.5}}, CudaGraphConfigError, ["cuda_graph.vision.warmup_steps", "integer"]),
    ({"vision": {"modules": ["attn"]}}, CudaGraphConfigError, ["cuda_graph.vision.modules", "captured whole"]),
    ({"vision": {"tensor_parallel_size": 0}}, CudaGraphConfigError, ["tensor_parallel_size", ">= 1"]),
    ({"vision": {"token_budgets": []}}, CudaGraphConfigError, ["token_budgets", "non-empty"]),
    ({"vision": {"token_budgets": [1024, "x"]}}, CudaGraphConfigError, ["token_budgets", "integers"]),
    ({"vision": {"token_budgets": [0, 16]}}, CudaGraphConfigError, ["token_budgets must be positive"]),
    ({"vision": {"token_budgets": [4096, 1024]}}, CudaGraphConfigError, ["ascending", "[1024, 4096]"]),
    ({"vision": {"token_budgets": [1024, 1024]}}, CudaGraphConfigError, ["without repeats"]),
    ({"vision": {"max_images_per_microbatch": 0}}, CudaGraphConfigError, ["max_images_per_microbatch", ">= 1"]),
    ({"num_microbatches": 0}, CudaGraphConfigError, ["cuda_graph.num_microbatches", ">= 1"]),
    ({"on_capture_error": "ignore"}, CudaGraphConfigError, ["on_capture_error", "'eager' or 'raise'"]),
    ({"cached_walks": {"optimizer": "yes"}}, CudaGraphConfigError, ["cached_walks.optimizer", "true, false or null"]),
    (
        {"cached_walks": {"grad_finalize": True}},
        CudaGraphConfigError,
        ["cached_walks.grad_finalize=true", "no graphs"],
    ),
    ({"forward": {"positions": 1}}, CudaGraphConfigError, ["cuda_graph.forward.positions", "true, false or null"]),
    ({"forward": {"collated_grids": True}}, CudaGraphConfigError, ["forward.collated_grids=true", "no graphs"]),
    ({"forward": 3}, CudaGraphConfigError, ["cuda_graph.forward must be a mapping"]),
    ({"forward": {"position": True}}, UnknownKeyError, ["cuda_graph.forward.position", "'positions'"]),
    (
        {"language": {"enabled": True}, "forward": {"flat_rows": True, "positions": False}},
        CudaGraphConfigError,
        ["forward.flat_rows=true", "forward.positions is false", "set cuda_graph.forward.positions to null"],
    ),
    ({"language": {"tight_packing": True}}, CudaGraphConfigError, ["language.tight_packing=true", "enabled is false"]),
    ({"language": {"tight_packing": "no"}}, CudaGraphConfigError, ["tight_packing", "true, false or null"]),
    # renamed settings and values, with their new names
    (
        {"fewer_host_waits": False},
        CudaGraphConfigError,
        [
            "fewer_host_waits was split",
            "cuda_graph.forward.positions=false",
            "cuda_graph.forward.collated_grids=false",
        ],
    ),
    ({"fewer_host_waits": None}, CudaGraphConfigError, ["fewer_host_waits was split", "delete it"]),
    (
        {"optimizer_host_cache": False},
        CudaGraphConfigError,
        ["optimizer_host_cache was split", "cached_walks.optimizer=false", "cached_walks.grad_finalize=false"],
    ),
    ({"language": {"graph_unit": "deepstack"}}, CudaGraphConfigError, ["'deepstack' was renamed", "graph_unit=run"]),
    # wrong scalar types from YAML
    ({"language": {"enabled": "yes"}}, CudaGraphConfigError, ["cuda_graph.language.enabled", "true or false"]),
    ({"vision": {"tensor_parallel_size": "2"}}, CudaGraphConfigError, ["tensor_parallel_size", "integer"]),
    ({"vision": {"tensor_parallel_size": True}}, CudaGraphConfigError, ["tensor_parallel_size", "integer"]),
    ({"vision": {"token_budgets": 1024}}, CudaGraphConfigError, ["token_budgets must be a list"]),
    ({"language": ["enabled"]}, CudaGraphConfigError, ["cuda_graph.language must be a mapping"]),
    # unknown keys, with the nearest valid name
    ({"vision": {"token_budget": [1024]}}, UnknownKeyError, ["cuda_graph.vision.token_budget", "'token_budgets'"]),
    ({"langauge": {}}, UnknownKeyError, ["cuda_graph.langauge", "'language'"]),
    ({"language": {"enable": True}}, UnknownKeyError, ["cuda_graph.language.enable", "'enabled'"]),
]


@pytest.mark.parametrize(("block", "error", "fragments"), ERRORS, ids=[str(e[0]) for e in ERRORS])
def test_every_error_names_the_setting(block, error, fragments):
    """Each refused block raises its error type, with the setting path and the fix in the message."""
    with pytest.raises(error) as info:
        cuda_graph_config_from_dict(block)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message


# Blocks built in Python (or changed by Bridge's setattr after loading): validate() is the only guard.
VALIDATE_ERRORS = [
    (CudaGraphConfig(language=LanguageGraphConfig(modules="attn")), ["cuda_graph.language.modules", "[attn]"]),
    (CudaGraphConfig(vision=VisionGraphConfig(warmup_steps=1.5)), ["cuda_graph.vision.warmup_steps", ">= 0"]),
    (CudaGraphConfig(vision=VisionGraphConfig(tensor_parallel_size="2")), ["tensor_parallel_size", ">= 1"]),
    (CudaGraphConfig(vision=VisionGraphConfig(token_budgets=[True])), ["token_budgets", "integers"]),
    (CudaGraphConfig(vision=VisionGraphConfig(max_images_per_microbatch=2.0)), ["max_images_per_microbatch"]),
    (CudaGraphConfig(num_microbatches="4"), ["cuda_graph.num_microbatches"]),
]


@pytest.mark.parametrize(("cfg", "fragments"), VALIDATE_ERRORS, ids=range(len(VALIDATE_ERRORS)))
def test_validate_catches_what_setattr_let_through(cfg, fragments):
    """``validate()`` itself refuses wrong values that never went through ``cuda_graph_config_from_dict``."""
    with pytest.raises(CudaGraphConfigError) as info:
        cfg.validate()
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def test_validate_refuses_plain_mappings_in_place_of_blocks():
    """A block whose parts were replaced by plain dicts (a YAML path that bypassed our loader) is refused."""
    cfg = CudaGraphConfig()
    cfg.language = {"enabled": True}  # type: ignore[assignment]
    with pytest.raises(CudaGraphConfigError, match="cuda_graph_config_from_dict"):
        cfg.validate()


def test_every_graphable_module_is_accepted():
    """Each module name Megatron-Core knows passes alone (or with the router it needs)."""
    for module in GRAPHABLE_MODULES:
        modules = [module, "moe_router"] if module == "moe_preprocess" else [module]
        LanguageGraphConfig(modules=modules).validate()


def test_validate_messages_are_one_line():
    """Errors are printed as one ``error:`` line by the CLI."""
    for block, _, _ in ERRORS:
        try:
            cuda_graph_config_from_dict(block)
        except (CudaGraphConfigError, UnknownKeyError) as error:
            assert "\n" not in str(error)


@pytest.mark.parametrize(
    ("block", "fix"),
    [
        (
            {"fewer_host_waits": False},
            (
                "~cuda_graph.fewer_host_waits",
                *(f"cuda_graph.forward.{part}=false" for part in FORWARD_PARTS),
            ),
        ),
        ({"fewer_host_waits": True}, ("~cuda_graph.fewer_host_waits",)),
        (
            {"optimizer_host_cache": False},
            (
                "~cuda_graph.optimizer_host_cache",
                "cuda_graph.cached_walks.optimizer=false",
                "cuda_graph.cached_walks.grad_finalize=false",
            ),
        ),
        ({"vision": {"graph_unit": "deepstack"}}, ("cuda_graph.vision.graph_unit=run",)),
    ],
)
def test_a_renamed_setting_is_refused_with_a_fix_that_does_what_it_did(block, fix):
    """The refusal's fix deletes the old key and sets the new ones to what the old value meant; applied, the block
    loads (``false`` of the split setting: each new setting ``false``)."""
    with pytest.raises(CudaGraphConfigError) as info:
        cuda_graph_config_from_dict(block)
    assert info.value.fix == fix
    for setting in fix:
        assert setting.lstrip("~").split("=")[0] in str(info.value)


def test_a_renamed_setting_set_in_python_is_refused_by_validate():
    """Bridge's ``setattr`` overrides (or a user's Python) can put an old name on the block past the loader:
    ``validate()`` refuses it with the new names."""
    cfg = CudaGraphConfig()
    cfg.optimizer_host_cache = False  # type: ignore[attr-defined]
    with pytest.raises(CudaGraphConfigError, match=r"optimizer_host_cache was split.*cached_walks\.optimizer=false"):
        cfg.validate()


def test_the_forward_parts_and_walks_are_each_a_field():
    """One setting per mechanism: the names the plan, the host install and the refusal advice use are the fields."""
    assert FORWARD_PARTS == tuple(f.name for f in dataclasses.fields(ForwardConfig))
    assert CACHED_WALKS == tuple(f.name for f in dataclasses.fields(CachedWalksConfig))
