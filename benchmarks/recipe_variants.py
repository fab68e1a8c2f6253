"""The useful-tokens benchmark's variants of a recipe file (``--model peft8b``): the file loaded with
:data:`VARIANT_OVERRIDES`, finalized and planned as ``bridge-cudagraph train`` does, with Bridge's PEFT."""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.real_loop import GRAPHS_OFF as _GRAPHS_OFF

#: ``--model`` names that come from a recipe file, and the file (relative to the repository root).
RECIPES = {"peft8b": "recipes/qwen3_vl_8b_peft_photos_graphs.yaml"}

#: Every row padded to seq_length (no in-batch packing), the file's packed budget ladder dropped.
_PADDED = (
    "dataset.enable_in_batch_packing=false",
    "dataset.defer_in_batch_packing_to_step=false",
    "dataset.pad_to_max_length=true",
    "model.cuda_graph.language.token_budgets=null",
)
#: The overrides that make each variant from the recipe file (which itself is ours_packed).
VARIANT_OVERRIDES: dict[str, tuple[str, ...]] = {
    "eager_packed": _GRAPHS_OFF,
    "eager_padded": _GRAPHS_OFF + _PADDED,
    "upstream_padded": _GRAPHS_OFF + _PADDED,  # then the host's class, with upstream's switches
    "ours_padded": _PADDED,
    "ours_packed": (),
    "eager_packed_repeat": _GRAPHS_OFF,
}


@dataclass
class RecipeVariant:
    """One variant: its finalized config and capture plan (None where no graph of ours is captured)."""

    config: Any
    plan: Any | None

    @property
    def provider(self) -> Any:
        return self.config.model

    def pre_wrap_hook(self):
        """Bridge's PEFT transformation of the recipe, or None for a recipe without ``peft``."""
        if (peft := getattr(self.config, "peft", None)) is None:
            return None
        from bridge_cudagraph.host.compat import peft_transformation

        return functools.partial(peft_transformation(), copy.deepcopy(peft))

    def register_peft(self, pg_collection: Any) -> None:
        """Register :meth:`pre_wrap_hook`, after a hook giving every config without groups ``pg_collection``."""
        if (hook := self.pre_wrap_hook()) is None:
            return
        from megatron.core.transformer.transformer_config import TransformerConfig

        from bridge_cudagraph.host.compat import config_pg_collection, register_pre_wrap_hook, set_config_pg_collection

        def attach_groups(model: list) -> list:
            for chunk in model:
                for module in chunk.modules():
                    config = getattr(module, "config", None)
                    if isinstance(config, TransformerConfig) and config_pg_collection(config) is None:
                        set_config_pg_collection(config, pg_collection)
            return model

        register_pre_wrap_hook()(self.provider, attach_groups)
        register_pre_wrap_hook()(self.provider, hook)


def upstream_graphs_provider(provider: Any, vision_seq_length: int) -> Any:
    """``provider`` as Bridge's host provider with megatron-core's TE graphs on, vision at ``vision_seq_length``."""
    from bridge_cudagraph.examples import tiny

    plain = tiny.upstream_provider(provider)
    plain.vision_cuda_graph_impl = "transformer_engine"
    plain.max_vision_cuda_graph_seq_length = vision_seq_length
    return plain


def recipe_path(model: str) -> Path:
    """The recipe file of ``--model``."""
    return Path(__file__).resolve().parents[1] / RECIPES[model]


def recipe_shape(model: str) -> tuple[int, int, int]:
    """``(seq_length, micro_batch_size, global_batch_size)`` of the recipe file, as loaded (no GPU, no model)."""
    from bridge_cudagraph.recipe.load import load_recipe

    cfg = load_recipe(recipe_path(model)).config
    return int(cfg.model.seq_length), int(cfg.train.micro_batch_size), int(cfg.train.global_batch_size)


def load_variant(
    model: str,
    variant: str,
    *,
    seq_length: int,
    micro_batch_size: int,
    num_microbatches: int,
    upstream_vision_seq_length: int,
) -> RecipeVariant:
    """The recipe of ``--model`` as ``variant`` at ``num_microbatches`` micro-batches per step on one GPU. Raises
    RuntimeError where ``seq_length`` or ``micro_batch_size`` differ from the finalized variant's; KeyError,
    CudaGraphConfigError or RecipeError where the variant is unknown or refused."""
    from bridge_cudagraph.plan.from_config import finalize_config, plan_config
    from bridge_cudagraph.recipe.load import load_recipe

    overrides = (*VARIANT_OVERRIDES[variant], f"train.global_batch_size={micro_batch_size * num_microbatches}")
    cfg = load_recipe(recipe_path(model), overrides).config
    finalize_config(cfg, world_size=1, base_checkpoint_needed=False)
    graphs = cfg.model.cuda_graph.any_enabled
    plan = plan_config(cfg, world_size=1, finalized=True) if graphs else None
    if variant == "upstream_padded":
        cfg.model = upstream_graphs_provider(cfg.model, upstream_vision_seq_length)
    got = (int(cfg.model.seq_length), int(cfg.train.micro_batch_size))
    if got != (seq_length, micro_batch_size):
        raise RuntimeError(
            f"{variant}: the finalized (seq_length, micro_batch_size) {got} are not the recipe's "
            f"{(seq_length, micro_batch_size)}"
        )
    return RecipeVariant(config=cfg, plan=plan)
