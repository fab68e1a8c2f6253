"""Useful tokens per second on Bridge's own Qwen3-VL fine-tuning data path: packed eager vs padded and packed graphs.

Every variant trains in this process from the same initial weights on the same photo micro-batches, then the paired
phase and the control; ``useful_tokens.json`` is written after each (layout: :mod:`benchmarks.report`)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from benchmarks import recipe_variants, report, runner
from benchmarks.configs import MERGE, QWEN3_VL_TOKENS, QWEN3_VL_VOCAB, BenchConfig
from benchmarks.flops import peak_tflops, step_flops
from benchmarks.host_syncs import census
from benchmarks.report import CONTROL, FORM, PACKED, PACKED_GRAPHED, PADDED, PADDED_CONTROL, PAIRED
from benchmarks.runner import OK, json_safe, say, write_json
from benchmarks.trace import gpu_busy_summary

if TYPE_CHECKING:
    from bridge_cudagraph.config import CudaGraphConfig
    from bridge_cudagraph.plan.budgets import PackedLayout
    from bridge_cudagraph.plan.capture_plan import CapturePlan
    from bridge_cudagraph.plan.memory import TrainingFacts

logger = logging.getLogger("benchmarks.useful_tokens")

#: Training samples in the photo set's train split.
PHOTO_TRAIN_SAMPLES = 256
JSON_NAME = "useful_tokens.json"
#: The variants an MoE model measures (not upstream's, which would need an MoE scope of its own).
MOE_VARIANTS: tuple[str, ...] = ("eager_packed", "eager_padded", "ours_padded", "ours_packed")
#: Language layers of the 30B-A3B shape (its own 48 need EP; 4 hold the layer's shape on one GPU).
MOE_30B_LAYERS = 4


def _tiny_provider(cuda_graph: CudaGraphConfig | None = None, *, seq_length: int, **overrides: Any) -> Any:
    """The tiny Qwen3-VL (dense, or MoE with ``moe=True``) at ``seq_length``."""
    from bridge_cudagraph.examples import tiny

    return tiny.tiny_qwen3_vl_provider(
        cuda_graph, seq_length=seq_length, language_max_sequence_length=seq_length, **overrides
    )


def _qwen3_vl_shape(cuda_graph, seq_length: int, overrides: dict, deepstack: list, vision: dict, tied: bool, **fields):
    """Qwen3-VL's language layer (hidden 2048, vocabulary, token ids) with ``fields``, the output weights ``tied`` to
    the embedding or not, a vision encoder of ``vision``'s fields tapped after ``deepstack``; ``overrides`` win."""
    from bridge_cudagraph.examples import tiny

    fields.update(
        hidden_size=2048,
        ffn_hidden_size=6144,
        kv_channels=128,
        vocab_size=QWEN3_VL_VOCAB,
        mrope_section=[24, 20, 20],
        layernorm_epsilon=1e-6,
        **QWEN3_VL_TOKENS,
        share_embeddings_and_output_weights=tied,
        deepstack_visual_indexes=list(deepstack),
        vision_config=tiny.tiny_vision_config(2048, deepstack_visual_indexes=list(deepstack), **vision),
    )
    return _tiny_provider(cuda_graph, seq_length=seq_length, **{**fields, **overrides})


def small_qwen3_vl_provider(cuda_graph=None, *, seq_length: int, **overrides: Any):
    """A Qwen3-VL-2B-shaped provider (random weights) with ``cuda_graph``; ``overrides`` replace any field."""
    vision = dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, num_position_embeddings=2304)
    layers = dict(num_layers=28, num_attention_heads=16, num_query_groups=8, out_hidden_size=2048)
    merge = dict(spatial_merge_size=MERGE, num_position_embeddings=2304)
    return _qwen3_vl_shape(cuda_graph, seq_length, overrides, [5, 11, 17], vision, True, **layers, **merge)


def qwen3_vl_30b_a3b_shape_provider(
    cuda_graph: CudaGraphConfig | None = None, *, seq_length: int, **overrides: Any
) -> Any:
    """Qwen3-VL-30B-A3B's shape at :data:`MOE_30B_LAYERS` language layers; ``overrides`` replace any field."""
    vision = dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16)
    layers = dict(num_layers=MOE_30B_LAYERS, num_attention_heads=32, num_query_groups=4)
    experts = dict(moe=True, moe_ffn_hidden_size=768, num_moe_experts=128, moe_router_topk=8, moe_grouped_gemm=True)
    return _qwen3_vl_shape(cuda_graph, seq_length, overrides, [8, 16, 24], vision, False, **layers, **experts)


@dataclass(frozen=True)
class ModelDef:
    """One ``--model``: what it is, how its provider is made, and what its graphs capture."""

    description: str
    provider: Callable[..., Any] | None = None
    """``provider(cuda_graph, *, seq_length, **fields)``, not finalized; None for a recipe model."""
    variants: tuple[str, ...] = report.VARIANTS
    """What runs when ``--variants`` is left out (besides the control)."""
    optional: tuple[str, ...] = ()
    """What ``--variants`` may add."""


#: Every ``--model``.
MODELS: dict[str, ModelDef] = {
    "tiny": ModelDef("tiny Qwen3-VL (4 + 4 layers)", _tiny_provider, optional=(*report.PADDED_PARTS, PADDED_CONTROL)),
    "small": ModelDef(
        "Qwen3-VL-2B shape (language 28 x 2048, vision 24 x 1024), random weights",
        small_qwen3_vl_provider,
        optional=(*report.PADDED_PARTS, PADDED_CONTROL),
    ),
    "tiny-moe": ModelDef(
        "tiny Qwen3-VL MoE (4 + 4 layers, 4 experts, top 2, alltoall, aux loss), language graphs of each layer's "
        "attention (modules null), padded and packed",
        functools.partial(_tiny_provider, moe=True),
        variants=MOE_VARIANTS,
        optional=(PADDED_CONTROL,),
    ),
    "moe-30b-a3b-shape": ModelDef(
        f"Qwen3-VL-30B-A3B shape at {MOE_30B_LAYERS} language layers (2048 hidden, 32 heads / 4 KV groups x 128, "
        "128 experts of 768, top 8, grouped GEMM, alltoall, aux loss; vision 27 x 1152), random weights, EP 1, "
        "language graphs of each layer's attention (modules null), padded and packed",
        qwen3_vl_30b_a3b_shape_provider,
        variants=MOE_VARIANTS,
        optional=(PADDED_CONTROL,),
    ),
    "peft8b": ModelDef(
        "Bridge's Qwen3-VL 8B LoRA recipe (qwen3_vl_8b_peft_1gpu_h100_bf16_config: language 36 x 4096, vision "
        "27 x 1152, LoRA dim 32 on linear_qkv/proj/fc1/fc2), random weights, offline"
    ),
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (checked by :func:`check_args`)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.useful_tokens", description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--out", required=True, help="output folder for useful_tokens.json and .md")
    add("--model", choices=tuple(MODELS), default="small", help="small: the 2B shape; tiny: a smoke test")
    add("--seq", type=int, help="seq_length (default 4096; a recipe model: its own)")
    add("--mbs", type=int, help="micro-batch size (default 2; a recipe: its own)")
    add("--num-mb", type=int, help="micro-batches per optimizer step (default 2; a recipe: its own)")
    add("--steps", type=int, default=15, help="measured steps per variant")
    add("--warmup", type=int, default=3, help="eager steps before capture")
    add("--microbatches", type=int, default=8, help="distinct micro-batches (cycled)")
    add("--profile-steps", type=int, default=2, help="0: no profiler")
    add("--no-paired", action="store_true", help="skip the paired phase")
    add("--paired", metavar="A,B", help=f"the paired phase's two variants, A ms / B ms (default {','.join(PAIRED)})")
    add("--no-control", action="store_true", help="skip eager_packed_repeat (the noise floor)")
    add("--variants", metavar="A,B", help="run only these variants, in the usual order (default: the model's)")
    add("--gpu-memory", type=float, metavar="GIB", help="cap the process at GIB of GPU memory, as train does")
    return parser.parse_args(argv)


#: ``--seq``, ``--mbs``, ``--num-mb`` of the models that do not come from a recipe file.
SHAPE_DEFAULTS = {"seq": 4096, "mbs": 2, "num_mb": 2}


def fill_shape(args: argparse.Namespace) -> str | None:
    """Fill ``--seq``, ``--mbs`` and ``--num-mb`` left out (:data:`SHAPE_DEFAULTS`, or a recipe model's own); the
    refusal (one sentence) of a recipe model's ``--seq`` or ``--mbs`` other than its own, else None."""
    if args.model not in recipe_variants.RECIPES:
        for name, value in SHAPE_DEFAULTS.items():
            if getattr(args, name) is None:
                setattr(args, name, value)
        return None
    seq, mbs, gbs = recipe_variants.recipe_shape(args.model)
    for name, value in (("seq", seq), ("mbs", mbs)):
        if (given := getattr(args, name)) not in (None, value):
            return (
                f"--{name} {given}: the {args.model} recipe ({recipe_variants.RECIPES[args.model]}) trains at "
                f"{value}; leave --{name} out"
            )
        setattr(args, name, value)
    if args.num_mb is None:
        args.num_mb = gbs // mbs
    return None


def check_args(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line (one sentence: the setting and the fix), or None; fills the shape first."""
    if problem := fill_shape(args):
        return problem
    if args.mbs < 2:
        return f"--mbs {args.mbs}: Bridge's in-batch packing needs a micro-batch of at least 2; use --mbs 2 or more"
    if args.seq < 1024 or args.seq % 128:
        return f"--seq {args.seq}: use a multiple of 128 of at least 1024 (the photo samples run to ~1.2k tokens)"
    for name, least in (("num_mb", 1), ("steps", 1), ("microbatches", 1), ("warmup", 0), ("profile_steps", 0)):
        if (value := getattr(args, name)) < least:
            return f"--{name.replace('_', '-')} {value}: must be {'at least 1' if least else '0 or more'}"
    if args.gpu_memory is not None and not args.gpu_memory > 0:
        return f"--gpu-memory {args.gpu_memory:g}: give the GiB to cap the process at (80 for an 80 GB H100)"
    if args.variants is not None:
        chosen = [v for v in args.variants.split(",") if v]
        allowed = (*MODELS[args.model].variants, *MODELS[args.model].optional)
        if not chosen or any(v not in allowed for v in chosen):
            return f"--variants {args.variants}: the {args.model} model measures {','.join(allowed)}; choose from them"
        if (reference := report.REFERENCE[PACKED]) not in chosen:
            return f"--variants {args.variants}: include {reference}, the reference of every packed variant"
    if not args.no_paired and args.paired is not None:
        pair = [v for v in args.paired.split(",") if v]
        run = chosen_variants(args)
        if len(pair) != 2 or pair[0] == pair[1] or any(v not in run for v in pair):
            return (
                f"--paired {args.paired}: name two different variants of this run ({','.join(run)}), e.g. "
                f"--paired {','.join(PAIRED)}; or add them to --variants, or pass --no-paired"
            )
    if args.microbatches * args.mbs > PHOTO_TRAIN_SAMPLES:
        return (
            f"--microbatches {args.microbatches} x --mbs {args.mbs} = {args.microbatches * args.mbs} samples, more "
            f"than the photo set's {PHOTO_TRAIN_SAMPLES} training samples; lower --microbatches"
        )
    return None


def chosen_variants(args: argparse.Namespace) -> tuple[str, ...]:
    """The variants the run measures in run order (the control besides): ``--variants``, or the model's."""
    if args.variants is None:
        return MODELS[args.model].variants
    named = set(args.variants.split(","))
    return tuple(v for v in report.ORDER if v in named)


def paired_pair(args: argparse.Namespace) -> tuple[str, str]:
    """``--paired``'s two variants (checked by :func:`check_args`), or :data:`PAIRED` where it is left out."""
    if args.paired is None:
        return PAIRED
    first, second = (v for v in args.paired.split(",") if v)
    return first, second


def photo_microbatches(
    count: int, micro_batch_size: int, seq_length: int, *, cache=None, spec=None
) -> tuple[Any, list[dict]]:
    """``(processor, collated micro-batches)`` of the photo set's first training samples, by Bridge, on the CPU."""
    from megatron.bridge.data.utils import get_dataset_provider

    from bridge_cudagraph.examples.photo_recipe import build_photo_data, photo_dataset_config

    photos, processor = build_photo_data(cache, spec)
    config = photo_dataset_config(photos, processor, seq_length)
    config.finalize()
    train, _, _ = get_dataset_provider(config)([count * micro_batch_size, 0, 0], config, tokenizer=None)
    batches = [
        train.collate_fn([train[i * micro_batch_size + j] for j in range(micro_batch_size)]) for i in range(count)
    ]
    return processor, batches


def token_ids(processor) -> dict[str, int]:
    """The processor's special ids, as provider fields."""
    names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    return {name: getattr(processor, name) for name in names}


def microbatch_stats(collated: dict, packed: dict, padded: dict, visual_ids: Sequence[int] = ()) -> report.MicroBatch:
    """The numbers of one collated micro-batch and its two forms; raises where a form lost a loss token."""
    rows, width = collated["input_ids"].shape
    loss = round(float(collated["loss_mask"].sum()))
    for form, batch in ((PACKED, packed), (PADDED, padded)):
        got = round(float(batch["loss_mask"].sum()))
        if got != loss:
            raise RuntimeError(f"the {form} form holds {got} loss tokens, the collated batch {loss}")
    grid = image_grid(collated)
    return report.MicroBatch(
        rows=int(rows),
        width=int(width),
        real_tokens=int(collated["attention_mask"].sum()),
        loss_tokens=loss,
        packed_tokens=int(packed["input_ids"].numel()),
        padded_tokens=int(padded["input_ids"].numel()),
        patches=0 if grid is None else int(grid.prod(-1).sum()),
        images=0 if grid is None else int(grid.size(0)),
        tight_tokens=tight_tokens(packed, visual_ids),
    )


def image_grid(collated: dict) -> torch.Tensor | None:
    """The collated micro-batch's ``image_grid_thw`` (None without images)."""
    visual = collated.get("visual_inputs")
    return (visual.normalized_for_model() if visual is not None else {}).get("image_grid_thw")


def tight_tokens(packed: dict, visual_ids: Sequence[int]) -> int:
    """Tokens of the packed form as the replay packs it tightly (0 where its rows are not the step's rows)."""
    from bridge_cudagraph.capture.tight import tight_rows
    from bridge_cudagraph.micro_batch import row_extents

    ids = packed["input_ids"].detach().cpu()
    extents = row_extents(packed["loss_mask"].detach().cpu(), ids, visual_ids)
    return 0 if extents is None else tight_rows(extents, ids.size(1)).tokens


def step_forms(collated: Sequence[dict], pg_collection, seq_length: int, device="cuda") -> dict[str, list[dict]]:
    """Both forms of every collated micro-batch by Bridge's step functions: packed, and padded to ``seq_length``."""
    from bridge_cudagraph.testing.step_batch import qwen3_vl_step_inputs

    def form(**kind: bool) -> list[dict]:
        return [qwen3_vl_step_inputs(c, pg_collection, seq_length=seq_length, device=device, **kind) for c in collated]

    return {PACKED: form(packed=True), PADDED: form(packed=False, pad_to_seq_length=True)}


def image_sets(collated: Sequence[dict]) -> tuple:
    """The micro-batches' image grids as :class:`benchmarks.configs.BenchConfig`'s ``image_sets``."""
    grids = (image_grid(batch) for batch in collated)
    return tuple(tuple(((int(t), int(h), int(w)),) for t, h, w in ([] if g is None else g.tolist())) for g in grids)


@dataclass
class BenchRun:
    """What every variant of one run shares, and the finished records."""

    args: argparse.Namespace
    world: Any
    cfg: BenchConfig
    layout: Any
    ids: dict[str, int]
    micro: list[report.MicroBatch]
    shared: dict[str, Any]
    """Per form, a :class:`benchmarks.runner.StepData`."""
    initial_state: list[dict] | None = None
    references: dict[str, dict] = field(default_factory=dict)
    """Per reference variant: its profile and fixed-batch and step numbers."""
    results: dict[str, dict] = field(default_factory=dict)
    profiler_sees_graph_kernels: bool | None = None
    flops: list[float] = field(default_factory=list)
    """Model FLOPs of each padded micro-batch, for the MFU; empty for a recipe or MoE model."""
    data: dict[str, Any] = field(default_factory=dict)
    """``useful_tokens.json``'s ``data``."""

    @property
    def from_recipe(self) -> bool:
        """The variants are a recipe file's (:mod:`benchmarks.recipe_variants`)."""
        return self.args.model in recipe_variants.RECIPES


def recipe_variant(args: argparse.Namespace, cfg: BenchConfig, variant: str) -> recipe_variants.RecipeVariant:
    """``variant`` loaded afresh from the recipe file of ``--model``."""
    return recipe_variants.load_variant(
        args.model,
        variant,
        seq_length=args.seq,
        micro_batch_size=args.mbs,
        num_microbatches=args.num_mb,
        upstream_vision_seq_length=cfg.upstream_vision_seq_length(),
    )


def ours_graph_config(cfg: BenchConfig, language_budgets: Sequence[int] | None = None) -> CudaGraphConfig:
    """ours_padded's block (language graphs of whole layers, of an MoE layer its attention; vision graphs with the
    data's budgets; capture failures raised), or ours_packed's with ``language_budgets``, the run's ladder."""
    from bridge_cudagraph.config import CudaGraphConfig, LanguageGraphConfig, VisionGraphConfig

    budgets = None if language_budgets is None else list(language_budgets)
    return CudaGraphConfig(
        language=LanguageGraphConfig(enabled=True, token_budgets=budgets),
        vision=VisionGraphConfig(
            enabled=True, token_budgets=cfg.vision_budgets(), max_images_per_microbatch=cfg.vision_max_segments()
        ),
        num_microbatches=cfg.num_microbatches,
        on_capture_error="raise",
    )


def variant_provider(run: BenchRun, variant: str):
    """The provider of ``variant`` (not finalized) with the run's token ids and the variant's graph block (upstream's:
    the host provider with megatron-core's graphs); ValueError for a variant the model has no provider of."""
    model = MODELS[run.args.model]
    unknown = f"no provider of {variant!r} for --model {run.args.model}; known: {[*report.ORDER, CONTROL]}"
    if model.provider is None:
        raise ValueError(unknown)
    if variant == "upstream_padded":
        plain = model.provider(None, seq_length=run.cfg.seq_length, **run.ids)
        return recipe_variants.upstream_graphs_provider(plain, run.cfg.upstream_vision_seq_length())
    padded = ours_graph_config(run.cfg)
    blocks: dict[str, CudaGraphConfig | None] = {
        **dict.fromkeys(("eager_packed", "eager_padded", PADDED_CONTROL, CONTROL)),
        "ours_padded": padded,
        "ours_packed": ours_graph_config(run.cfg, run.layout.budgets),
    }
    for name, parts in report.PADDED_PARTS.items():
        replaced = {sub: dataclasses.replace(getattr(padded, sub), **fields) for sub, fields in parts.items()}
        blocks[name] = dataclasses.replace(padded, **replaced)
    if variant not in blocks:
        raise ValueError(unknown)
    return model.provider(blocks[variant], seq_length=run.cfg.seq_length, **run.ids)


def packed_plan(run: BenchRun, provider: Any, training: TrainingFacts | None = None) -> CapturePlan:
    """The plan of ``provider``'s block for Bridge's Qwen3-VL step; CudaGraphConfigError on a refusal."""
    from bridge_cudagraph.plan.build import build_plan
    from bridge_cudagraph.plan.facts import PackingFacts, model_facts

    return build_plan(
        model_facts(provider),
        provider.cuda_graph,
        world_size=1,
        micro_batch_size=run.args.mbs,
        global_batch_size=run.args.mbs * run.args.num_mb,
        packing=PackingFacts("qwen3_vl_step"),
        training=training,
    )


def refusal(run: BenchRun, variant: str) -> str | None:
    """The first line of the plan's refusal of a packed graph variant of a non-recipe model, or None."""
    from bridge_cudagraph.config import CudaGraphConfigError

    if variant not in PACKED_GRAPHED or run.from_recipe:
        return None
    try:
        packed_plan(run, variant_provider(run, variant))
    except CudaGraphConfigError as error:
        return str(error).strip().splitlines()[0]
    return None


def _build(run: BenchRun, variant: str, objs: dict) -> None:
    """Build the model into ``objs``, load the initial weights (the first build snapshots them), make the optimizer."""
    from bridge_cudagraph.examples import tiny
    from bridge_cudagraph.host.wgrad_fusion import te_modules_fusing
    from bridge_cudagraph.testing.parity import megatron_optimizer

    upstream = variant == "upstream_padded"
    if run.from_recipe:
        loaded = recipe_variant(run.args, run.cfg, variant)
        provider = objs["provider"] = loaded.provider
        objs["plan"] = loaded.plan
        loaded.register_peft(run.world.language)
    else:
        provider = objs["provider"] = variant_provider(run, variant)
    vision_pg_collection = tiny.DERIVE if upstream else run.world.vision
    model = objs["model"] = tiny.build(provider, run.world.language, vision_pg_collection=vision_pg_collection)
    objs["te_modules_fusing"] = sum(te_modules_fusing(chunk) for chunk in model)
    if run.initial_state is None:
        run.initial_state = runner.snapshot(model)
    else:
        runner.load_weights(model, run.initial_state, aliases_allowed=upstream)
    objs["optimizer"] = megatron_optimizer(model, run.world.language)


def _helpers(run: BenchRun, variant: str, objs: dict) -> list:
    """The variant's graph helpers, language first: upstream's as Bridge's ``train()`` builds them, or ours."""
    if variant == "upstream_padded":
        return runner.upstream_helpers(
            objs, run.world, seq_length=run.args.seq, micro_batch_size=run.args.mbs, num_microbatches=run.args.num_mb
        )
    if variant not in (*report.PADDED_GRAPHED, *PACKED_GRAPHED):
        return []
    if run.from_recipe:  # the recipe's own plan
        return objs["provider"].make_graph_helpers(objs["model"], plan=objs["plan"])
    if variant in PACKED_GRAPHED:
        plan = packed_plan(run, objs["provider"])
    else:  # the provider's own plan for padded micro-batches
        from bridge_cudagraph.testing.plans import plan_for

        world_size = torch.distributed.get_world_size()
        plan = plan_for(
            objs["provider"], world_size=world_size, micro_batch_size=run.args.mbs, num_microbatches=run.args.num_mb
        )
    helpers = runner.ours_helpers(objs, plan)
    if variant in PACKED_GRAPHED:
        from bridge_cudagraph.capture.packed import PackedLanguageGraphHelper

        if not isinstance(helpers[0], PackedLanguageGraphHelper) or helpers[0].tight != packs_tightly(variant, plan):
            raise RuntimeError(f"{variant}: the plan built {type(helpers[0]).__name__}, tight {plan.language.packed}")
    return helpers


def packs_tightly(variant: str, plan: CapturePlan) -> bool:
    """Whether ``variant``'s packed helper must pack its rows tightly (not on an MoE model)."""
    return variant in PACKED_GRAPHED and not plan.facts.num_moe_experts


def check_param_grads(variant: str, capture: dict) -> None:
    """Raise where a packed graph variant's ladders did not sum their parameter gradients in graphs."""
    summed = {sub: rec.get("param_grads_summed", 0) for sub, rec in capture.items()}
    if variant in PACKED_GRAPHED and not all(summed.values()):
        raise RuntimeError(f"{variant}: parameter gradients summed in graphs per ladder: {summed}")


def memory_estimates(run: BenchRun, objs: dict, capture: dict) -> dict[str, dict]:
    """Each ladder's measured pool against :func:`bridge_cudagraph.plan.memory.pool_estimate` at its captured top."""
    from bridge_cudagraph.plan.memory import TrainingFacts, pool_estimate

    plan = packed_plan(run, objs["provider"], TrainingFacts())
    out = {}
    for submodule, rec in capture.items():
        if not (captured := rec.get("budgets_captured")):
            continue
        estimate = pool_estimate(plan, submodule, captured[-1])
        measured = rec.get("graph_memory_bytes") or 0
        out[submodule] = {
            "top": captured[-1],
            "estimate_bytes": estimate,
            "measured_bytes": measured,
            "measured_over_estimate": measured / estimate if estimate else None,
        }
    return out


def _counters(helpers: list) -> dict[str, dict]:
    """Per submodule, its helper's replay, fallback, graph and failure counts (and tight replays, MoE tail tokens)."""
    out: dict[str, dict] = {}
    for h in (h for h in helpers if hasattr(h, "stats")):
        counts = out[h.submodule] = {
            key: getattr(h.stats, key) for key in ("replays", "eager_fallbacks", "graphs", "failed")
        }
        if hasattr(h, "tight_replays"):
            counts["tight_replays"] = h.tight_replays
        if getattr(h.stats, "moe_tail_tokens", None):  # packed MoE layers: tail tokens kept out of their MLP halves
            counts["moe_tail_tokens"] = dict(h.stats.moe_tail_tokens)
    return out


def forward_counters(variant: str, model: list) -> dict[str, int]:
    """The product's forward counters; raises where a packed graph variant's were not flat or on CPU grids."""
    from bridge_cudagraph.host import forward as forward_host

    counts = forward_host.counts_in(model)
    if variant in PACKED_GRAPHED and counts["cpu_positions_calls"]:
        if not counts["flat_batches"]:
            raise RuntimeError(f"{variant}: {counts['flat_batches']} micro-batches handed to the forward flat")
        if not counts["grid_binds"]:
            raise RuntimeError(f"{variant}: {counts['grid_binds']} forwards read the collate's CPU grids")
    return counts


def run_variant(run: BenchRun, variant: str) -> dict:
    """Build, warm up, capture, time, profile and check one variant, always freed (a refused one is not built)."""
    from bridge_cudagraph.testing.world import seed_rng

    rec: dict[str, Any] = {"status": "running", "form": FORM[variant], "graphed": variant in report.GRAPHED}
    reason = refusal(run, variant)
    if reason is not None:
        say(f"{variant}: refused: {reason}")
        return {**rec, "status": report.REFUSED, "reason": reason, "seconds": 0.0}
    objs: dict[str, Any] = {}
    started = runner.start_clean(rec)
    seed_rng(run.world.language, runner.SEED)
    try:
        _run_variant_body(run, variant, rec, objs)
        rec["status"] = OK
    except Exception as error:  # recorded; the other variants still run
        runner.record_failure(rec, error, variant)
    finally:
        if "te_modules_fusing" in objs:  # also where a later part failed the variant
            rec["te_modules_fusing"] = objs["te_modules_fusing"]
        survivors = runner.teardown(objs)
    runner.check_freed(rec, survivors)
    rec["seconds"] = time.perf_counter() - started
    return rec


def _start(
    run: BenchRun, variant: str, objs: dict, grown: dict, *, losses: list | None = None, grad_norms: list | None = None
) -> tuple[Callable[[int], float], dict[str, Any]]:
    """Build ``variant``, run its eager warm-up and capture its helpers: ``(run_step, record)``, the step runner of its
    measured steps (later rungs captured as needed, listed in ``grown``) and its build, warm-up and capture figures."""
    data = run.shared[FORM[variant]]
    t0 = time.perf_counter()
    _build(run, variant, objs)
    record: dict[str, Any] = {"build_s": time.perf_counter() - t0}
    helpers = objs["helpers"] = _helpers(run, variant, objs)
    run_step = runner.step_runner(data, objs, losses=losses, grad_norms=grad_norms)
    record["warmup_step_ms"] = [run_step(i) for i in range(data.warmup_steps)]
    if helpers:
        record.update(runner.capture(variant, helpers, upstream=variant == "upstream_padded"))
        run_step = runner.growing(run_step, helpers, grown)
    return run_step, record


def _run_variant_body(run: BenchRun, variant: str, rec: dict, objs: dict) -> None:
    shared = run.shared[FORM[variant]]
    losses: list[float] = []
    grad_norms: list[float] = []
    run_step, started = _start(run, variant, objs, rec, losses=losses, grad_norms=grad_norms)
    rec.update(started)
    model, optimizer, helpers = objs["model"], objs["optimizer"], objs["helpers"]
    if helpers:
        check_param_grads(variant, rec.get("capture") or {})
        rec["graph_memory_gib"] = rec["graph_memory_bytes"] / report.GIB
        say(f"{variant}: captured in {rec['capture_s']:.1f} s, {rec['graph_memory_gib']:.2f} GiB")
        if variant in PACKED_GRAPHED and not run.from_recipe:
            with runner.recorded(rec, "memory_estimate_error", limit=300):
                rec["memory_estimate"] = memory_estimates(run, objs, rec.get("capture") or {})
    measured = list(shared.measured)
    timer = objs["timer"] = runner.VisionTimer(model)  # CUDA events around each encoder call, measured steps only
    timer.active = True
    times, vision = [], []
    for i in measured:
        times.append(run_step(i))
        vision += timer.collect()
    timer.active = False
    rec.update(runner.VisionTimer.summary(vision, len(measured)))
    runner.record_peaks(rec)
    rec["step_ms"] = times
    rec.update(
        report.variant_metrics(
            variant,
            run.micro,
            shared.plan,
            measured,
            times,
            budgets=run.layout.budgets,
            max_sequences=run.layout.max_sequences,
            tight=any(getattr(h, "tight", False) for h in helpers),
        )
    )
    say(
        f"{variant}: step {rec['step_ms_median']:.1f} ms, {rec['useful_tokens_per_s'] or float('nan'):,.0f} useful "
        f"tok/s, fill {rec['fill_fraction']:.2f}"
    )

    # GPU busy and kernel time from a few profiled steps (the control runs them unprofiled).
    by_key: dict[Any, list[float]] = {}
    for i, ms in zip(measured, times, strict=True):
        by_key.setdefault(tuple(shared.plan[i]), []).append(ms)
    step_ms_by_key = {k: statistics.median(v) for k, v in by_key.items()}
    profiled = shared.profiled
    p_first = profiled.start
    profile = None
    if shared.profile_steps and variant == CONTROL:
        for i in profiled:
            run_step(i)
    elif shared.profile_steps:
        with runner.recorded(rec, "profile_error", what=f"{variant}: profiling failed"):
            profile, rec["host_time"] = runner.profile(shared, run_step, p_first, model=model, optimizer=optimizer)
        if "profile_error" in rec:  # the profiled steps it did not run, unprofiled
            for i in range(p_first + max(0, len(losses) - p_first), profiled.stop):
                run_step(i)
        if variant in report.GRAPHED or variant in report.REFERENCES:  # the same steps, kernels only, losses dropped
            kept = len(losses), len(grad_norms)
            with runner.recorded(rec, "cuda_only_profile_error"):
                rec["cuda_only_profile"] = runner.profile_cuda_only(shared, run_step, p_first)
            del losses[kept[0] :], grad_norms[kept[1] :]
    reference = report.reference_of(variant)
    if variant in report.REFERENCES:
        run.references.setdefault(variant, {})["profile"] = profile
    rec.update(
        gpu_busy_summary(
            profile,
            step_ms_by_key,
            [tuple(shared.plan[i]) for i in profiled],
            eager_profile=(run.references.get(reference) or {}).get("profile"),
            graphed=variant in report.GRAPHED,
            profiler_sees_graph_kernels=run.profiler_sees_graph_kernels,
            fallback_step_ms=rec["step_ms_median"],
        )
    )
    if profile is not None:
        rec["profile"] = profile
    if FORM[variant] == PADDED and run.flops:
        measured_flops = report.per_step(shared.plan, measured, run.flops)
        profiled_flops = report.per_step(shared.plan, profiled, run.flops)
        kernel_ms, peak = rec.get("kernel_ms_per_step"), peak_tflops(torch.cuda.get_device_name())
        rec.update(runner.model_flops_utilisation(measured_flops, times, profiled_flops, kernel_ms, peak))
    rec.update(losses=losses, grad_norms=grad_norms)
    if variant in (*report.PADDED_GRAPHED, *PACKED_GRAPHED):
        rec["counters"] = _counters(helpers)
        rec["eager_fallbacks"] = sum(c["eager_fallbacks"] for c in rec["counters"].values())
        rec["forward_counts"] = forward_counters(variant, model)

    # Parity: the fixed micro-batch with the initial weights copied back in (in place: the graphs stay valid).
    assert run.initial_state is not None
    runner.load_weights(model, run.initial_state, aliases_allowed=variant == "upstream_padded")
    before = {sub: c["replays"] for sub, c in _counters(helpers).items()}
    fixed_loss, grad_norm, grads = runner.fixed_batch_check(model, shared.fixed_batch)
    after = _counters(helpers)
    mask = shared.fixed_batch["loss_mask"].detach().float().cpu()
    packed_reference = run.references.get(report.REFERENCE[PACKED])
    rec["parity"] = parity(
        variant, fixed_loss, mask, grad_norm, losses, run.references.get(reference), packed_reference, grads=grads
    )
    if before:
        rec["parity"]["fixed_batch_replays"] = {sub: after[sub]["replays"] - n for sub, n in before.items()}
    fixed = rec["parity"].get("fixed_batch") or {}
    if fixed:
        loss = report.fmt_diff(fixed.get("loss_max_abs"))
        say(f"{variant}: fixed batch: loss {loss}; {report.fmt_grad_parity(fixed)}")
    if variant in report.REFERENCES:
        floor = grad_floor(model, shared.fixed_batch, fixed_loss, grads, mask)
        rec["parity"]["floor"] = floor.as_dict()
        run.references[variant].update(
            fixed_loss=fixed_loss, mask=mask, grad_norm=grad_norm, losses=list(losses), grads=grads, floor=floor
        )
    del grads
    runner.require_finite(losses, grad_norms)
    if variant in report.HOST_SYNC_VARIANTS:  # last, one more step by a runner of its own: the losses untouched
        census_step = runner.step_runner(shared, objs)
        with runner.recorded(rec, "host_syncs_error", limit=300, what=f"{variant}: host-sync census failed"):
            rec["host_syncs"] = census(lambda: census_step(min(p_first, len(shared.plan) - 1)))
    require_gradient_parity(variant, rec["parity"])


class GradientParityError(RuntimeError):
    """A graphed variant of ours whose fixed-batch gradients are beyond the eager floor."""


def grad_floor(model: list, batch: dict, loss: torch.Tensor, grads: dict, mask: torch.Tensor):
    """The eager-vs-eager floor: the reference's fixed-batch forward and backward again against ``loss``, ``grads``."""
    from bridge_cudagraph.testing.parity import diff

    again_loss, _, again = runner.fixed_batch_check(model, batch)
    return diff((again_loss, again), (loss, grads), worst=GRAD_WORST, loss_mask=mask)


#: Parameters listed per compared variant, furthest apart first.
GRAD_WORST = 12


def require_gradient_parity(variant: str, record: dict) -> None:
    """Raise :class:`GradientParityError` where our graphed variant's gradients are not within the floor."""
    if variant not in report.GRAPHED or variant == "upstream_padded":
        return
    fixed = record.get("fixed_batch") or {}
    grads = fixed.get("grads")
    if grads is None:
        raise GradientParityError(f"{variant}: no per-parameter gradient comparison (its reference did not run)")
    if not fixed.get("within_floor"):
        worst = grads.get("grad_worst_params") or []
        names = ", ".join(f"{p['name']} {p['rel_l2']:.2e}" for p in worst[:4])
        raise GradientParityError(
            f"{variant}: fixed-batch gradients beyond the eager floor: max rel L2 {grads.get('grad_max_rel_l2')} "
            f"against the floor's {fixed.get('floor_grad_max_rel_l2')}, {len(grads.get('grad_missing') or [])} "
            f"missing; furthest apart: {names}"
        )


def parity(
    variant: str,
    fixed_loss: torch.Tensor,
    mask: torch.Tensor,
    grad_norm: float,
    losses: Sequence[float],
    reference: dict | None,
    packed_reference: dict | None,
    grads: dict | None = None,
) -> dict[str, Any]:
    """One variant's parity record: its fixed-batch loss, gradients and step losses against ``reference``'s, whether
    every step is finite, and for a padded variant its loss tokens against ``packed_reference``'s."""
    from bridge_cudagraph.testing.parity import compare_series, diff, diff_losses, within_floor

    form = FORM[variant]
    out: dict[str, Any] = {
        "reference": report.reference_of(variant),
        "fixed_batch_loss_mean": float(fixed_loss.mean()),
        "fixed_batch_grad_norm": grad_norm,
        "nonfinite_steps": runner.non_finite_steps(losses),
    }
    out["losses_finite"] = not out["nonfinite_steps"]
    if variant == out["reference"] or reference is None or reference.get("fixed_loss") is None:
        return out
    if mask.numel() != fixed_loss.numel():
        raise RuntimeError(
            f"loss mask {tuple(mask.shape)} does not cover the per-token loss {tuple(fixed_loss.shape)}"
        )
    keep = mask.reshape(fixed_loss.shape) > 0
    out["fixed_batch"] = {
        **diff_losses(fixed_loss, reference["fixed_loss"]).as_dict(),
        "masked": diff_losses(fixed_loss[keep], reference["fixed_loss"][keep]).as_dict(),
        "grad_norm_rel_diff": abs(grad_norm - reference["grad_norm"]) / max(abs(reference["grad_norm"]), 1e-12),
    }
    if grads is not None and reference.get("grads") is not None:
        compared = diff(
            (fixed_loss, grads), (reference["fixed_loss"], reference["grads"]), worst=GRAD_WORST, loss_mask=mask
        )
        floor = reference["floor"]
        out["fixed_batch"].update(
            grads=compared.as_dict(),
            floor_grad_max_rel_l2=floor.grad_max_rel_l2,
            floor_exact=floor.exact,
            within_floor=within_floor(compared, floor),
        )
    out["steps"] = compare_series(losses, reference["losses"]).as_dict()
    if form == PADDED and packed_reference is not None and packed_reference.get("fixed_loss") is not None:
        out["vs_eager_packed_loss_tokens"] = cross_form_diff(fixed_loss, packed_reference).as_dict()
    return out


def cross_form_diff(padded_loss: torch.Tensor, packed_reference: dict):
    """The padded form's per-token loss against the packed form's on the same samples' loss tokens."""
    from bridge_cudagraph.testing.parity import diff_losses

    rows = padded_loss.size(0)
    packed = packed_reference["fixed_loss"].reshape(rows, -1)
    keep = packed_reference["mask"].reshape(rows, -1) > 0
    return diff_losses(padded_loss[:, : packed.size(1)][keep], packed[keep])


def _run_paired(run: BenchRun, names: tuple[str, str] = PAIRED) -> dict:
    """The two variants ``names`` built side by side, steps interleaved; ``ratios``: the first's ms / the second's."""
    from bridge_cudagraph.testing.world import seed_rng

    shared = run.shared[FORM[names[0]]]  # the step plan and step counts, which both forms share
    rec: dict[str, Any] = {"status": "running", "variants": list(names)}
    objs: dict[str, dict] = {name: {} for name in names}
    started = runner.start_clean(rec)
    runners: dict[str, Callable[[int], float]] = {}
    try:
        for name in names:
            seed_rng(run.world.language, runner.SEED)
            runners[name], figures = _start(run, name, objs[name], rec)
            if "capture_s" in figures:
                rec.setdefault("capture_s", {})[name] = figures["capture_s"]
        times: dict[str, list[float]] = {name: [] for name in names}
        steps = list(shared.measured)
        for k, i in enumerate(steps):
            for name in names if k % 2 == 0 else names[::-1]:
                times[name].append(runners[name](i))
        rec["step_ms"] = times
        rec["step_ms_median"] = {name: statistics.median(t) for name, t in times.items()}
        useful = report.per_step(shared.plan, steps, [m.loss_tokens for m in run.micro])
        rec["useful_tokens_per_s"] = {name: report.tokens_per_second(useful, t) for name, t in times.items()}
        rec["ratios"] = [a / b for a, b in zip(*(times[name] for name in names), strict=True)]
        rec["verdict"] = report.paired_verdict(rec["ratios"])
        rec["counters"] = {name: _counters(objs[name]["helpers"]) for name in names if objs[name]["helpers"]}
        runner.record_peaks(rec)
        rec["status"] = OK
    except Exception as error:  # recorded; the variants' own results stand
        runner.record_failure(rec, error, "paired")
    finally:
        runners.clear()  # their closures hold the models
        survivors = {name: runner.teardown(objs[name]) for name in names}
        for name in sorted(names, key=lambda n: not survivors[n]):
            part: dict[str, Any] = {"allocated_at_start_bytes": rec["allocated_at_start_bytes"]}
            runner.check_freed(part, survivors[name])
            if "leak" in part:
                rec.setdefault("leak", {})[name] = part["leak"]
        rec["left_allocated_bytes"] = torch.cuda.memory_allocated()
    rec["seconds"] = time.perf_counter() - started
    return rec


def _meta(args: argparse.Namespace, cfg: BenchConfig, command: str) -> dict:
    return {
        **runner.run_meta(command),
        "config": {
            "model": args.model,
            "description": MODELS[args.model].description,
            "recipe": recipe_variants.RECIPES.get(args.model),
            "global_batch_size": args.mbs * args.num_mb,
            "seq_length": args.seq,
            "micro_batch_size": args.mbs,
            "num_microbatches": args.num_mb,
            "measured_steps": args.steps,
            "warmup_steps": args.warmup,
            "profile_steps": args.profile_steps,
            "microbatches": args.microbatches,
            "paired": not args.no_paired,
            "paired_variants": None if args.no_paired else list(paired_pair(args)),
            "control": not args.no_control,
            "name": cfg.name,
            "gpu_memory_cap_gib": args.gpu_memory,
        },
    }


def derived_layout(seq_length: int, micro_batch_size: int) -> PackedLayout:
    """ours_packed's layout without a recipe: the product's ladder up to a micro-batch of full rows."""
    from bridge_cudagraph.plan.budgets import PackedLayout, derive_language_budgets

    budgets = derive_language_budgets(micro_batch_size * seq_length, multiple=micro_batch_size * 16)
    return PackedLayout(tuple(budgets), max_sequences=micro_batch_size, max_seqlen=seq_length)


def prepare(args: argparse.Namespace, world) -> BenchRun:
    """The photo micro-batches in both forms on the GPU, their numbers, the layouts and the step plan."""
    t0 = time.perf_counter()
    processor, collated = photo_microbatches(args.microbatches, args.mbs, args.seq)
    say(f"data: {len(collated)} micro-batches collated by Bridge in {time.perf_counter() - t0:.1f} s")
    forms = step_forms(collated, world.language, args.seq)
    visual_ids = (processor.image_token_id, processor.video_token_id)
    micro = [
        microbatch_stats(c, p, q, visual_ids) for c, p, q in zip(collated, forms[PACKED], forms[PADDED], strict=True)
    ]
    cfg = BenchConfig(
        name=f"photo-{args.model}-mbs{args.mbs}-seq{args.seq}",
        model=args.model,
        seq_length=args.seq,
        micro_batch_size=args.mbs,
        image_sets=image_sets(collated),
        num_microbatches=args.num_mb,
    )
    vision_budgets, vision_segments = cfg.vision_budgets(), cfg.vision_max_segments()
    if args.model in recipe_variants.RECIPES:  # the recipe's plan: its budgets, not ones derived here
        recipe_plan = recipe_variant(args, cfg, "ours_packed").plan
        assert recipe_plan is not None  # ours_packed captures graphs
        layout = recipe_plan.language.packed.layout
        vision_budgets = list(recipe_plan.vision.token_budgets)
        vision_segments = recipe_plan.vision.max_images_per_microbatch
    else:
        layout = derived_layout(args.seq, args.mbs)
    fixed = max(range(len(micro)), key=lambda i: micro[i].packed_tokens)
    total = args.warmup + args.steps + args.profile_steps
    plan = [[(i * args.num_mb + j) % len(collated) for j in range(args.num_mb)] for i in range(total)]
    steps = (args.warmup, args.steps, args.profile_steps)
    shared = {form: runner.StepData(world, batches, batches[fixed], plan, *steps) for form, batches in forms.items()}
    run = BenchRun(
        args=args, world=world, cfg=cfg, layout=layout, ids=token_ids(processor), micro=micro, shared=shared
    )
    make_provider = MODELS[args.model].provider
    provider = None if make_provider is None else make_provider(None, seq_length=args.seq)
    if provider is not None and not getattr(provider, "num_moe_experts", None):  # the FLOPs of dense layers only
        run.flops = [step_flops(provider, [batch]) for batch in forms[PADDED]]
    run.data = {
        "source": "the photo SFT set (bridge_cudagraph/examples/photo_recipe.py) through Bridge's "
        "DirectHFSFTDatasetConfig provider and collate_fn; forms by Bridge's qwen3_vl_step functions",
        "microbatches": [m.as_dict() for m in micro],
        "language_budgets": list(layout.budgets),
        "max_sequences": layout.max_sequences,
        "max_seqlen": layout.max_seqlen,
        "vision_budgets": vision_budgets,
        "vision_max_segments": vision_segments,
        "upstream_vision_seq_length": cfg.upstream_vision_seq_length(),
        "fixed_microbatch": fixed,
        "plan": plan,
        "token_ids": run.ids,
    }
    return run


def paired_skip_reason(
    results: dict[str, dict], gpu_memory_bytes: Callable[[], int], names: Sequence[str] = PAIRED
) -> str | None:
    """Why the paired phase of ``names`` cannot run (not run, refused, memory), or None."""
    if missing := [name for name in names if name not in results]:
        return f"{missing[0]} was not run (--variants)"
    if refused := [name for name in names if (results.get(name) or {}).get("status") == report.REFUSED]:
        return f"{refused[0]} was refused by the capture plan"
    return runner.paired_memory_check(results, gpu_memory_bytes(), names=tuple(names))


def failed_variants(data: dict, chosen: Sequence[str] | None = None) -> list[str]:
    """Of the variants asked for (or the run's main ones), those that neither finished nor were refused."""
    variants = data.get("variants") or {}
    optional = (n for n in report.PADDED_GRAPHED if n in variants)
    asked = tuple(chosen) if chosen is not None else (report.BASELINE, "ours_packed", *optional)
    return [n for n in asked if (variants.get(n) or {}).get("status") not in (OK, report.REFUSED)]


def run_all(args: argparse.Namespace, *, world, command: str | None = None) -> dict:
    """Every variant, the paired phase and the control; writes the JSON after each, then the .md."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run = prepare(args, world)
    command = command or runner.command_line("benchmarks.useful_tokens")
    data: dict[str, Any] = {"meta": _meta(args, run.cfg, command), "data": run.data}
    data["meta"]["outside_allocator_after_setup_bytes"] = runner.outside_allocator_bytes()
    data["variants"] = run.results
    json_path = out / JSON_NAME

    def write() -> None:
        write_json(json_path, report.finish(data))

    if args.profile_steps:
        try:
            probe = runner.probe_profiler_sees_graph_kernels()
        except Exception as error:
            probe = {"error": f"{type(error).__name__}: {error}"[:500], "sees_graph_kernels": None}
        data["meta"]["profiler_probe"] = probe
        run.profiler_sees_graph_kernels = probe.get("sees_graph_kernels")
    write()
    chosen = chosen_variants(args)
    if MODELS[args.model].provider is not None:  # made once before any model: a lazy import's pinned frames (leaks.py)
        for name in chosen:
            with contextlib.suppress(Exception):  # a variant that cannot be made fails, recorded, when it runs
                variant_provider(run, name)
    for name in chosen:
        say(f"{name}: start")
        run.results[name] = run_variant(run, name)
        write()
    if not args.no_paired:
        pair = paired_pair(args)
        why_not = paired_skip_reason(run.results, runner.gpu_memory_bytes, pair)
        if why_not:
            data["paired"] = {"status": "skipped", "reason": why_not, "variants": list(pair)}
            say(f"paired phase skipped: {why_not}")
        else:
            say(f"paired phase ({' and '.join(pair)}): start")
            data["paired"] = _run_paired(run, pair)
        write()
    if not args.no_control:
        say(f"{CONTROL}: start")
        run.results[CONTROL] = run_variant(run, CONTROL)
        write()
    try:
        report.render(json_path)
    except Exception as error:  # the JSON is the result; render it again on any machine
        say(f"render failed ({type(error).__name__}: {error}); run python -m benchmarks.report")
    print("\n" + report.text_table(data), flush=True)
    return json_safe(data)


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 2 with one ``error:`` line on bad input, 1 where a variant of :func:`failed_variants` failed."""
    args = parse_args(argv)
    problem = check_args(args)
    if problem is None and not torch.cuda.is_available():
        problem = "no CUDA GPU: the useful-tokens benchmark trains on one (render a result with benchmarks.report)"
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    from bridge_cudagraph.parallel.layout import VisionLayout
    from bridge_cudagraph.testing.world import close_world, init_world

    world = init_world(vision=VisionLayout(), seed=runner.SEED)
    runner.cap_gpu_memory(args.gpu_memory)
    try:
        data = run_all(args, world=world, command=runner.command_line("benchmarks.useful_tokens", argv))
    finally:
        close_world(world)
    failed = failed_variants(data, chosen_variants(args))
    if failed:
        say(f"failed: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    logging.basicConfig(level=os.environ.get("BRIDGE_CUDAGRAPH_LOG", "WARNING"))
    raise SystemExit(main())
