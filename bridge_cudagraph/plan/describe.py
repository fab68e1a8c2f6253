"""The plan as text: what ``plan`` prints and the callback logs (at most 119 columns a line). A value the plan
derived says where it came from, in parentheses; one the block sets is printed as it is.
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any

from bridge_cudagraph.parallel.layout import (
    ResolvedLayout,
    format_layout,
)
from bridge_cudagraph.plan.budgets import (
    LADDER_RATIO,
    MIN_IMAGE_MERGED_TOKENS,
)

if TYPE_CHECKING:
    from bridge_cudagraph.plan.facts import ModelFacts


def plural(count: int, noun: str) -> str:
    """``1 graph``, ``2 graphs``: a count and its noun, for the plan's text."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _joined(head: str, tail: str) -> list[str]:
    """``head, tail`` on one line where it fits 119 columns, else ``tail`` on an indented line of its own."""
    return [f"{head}, {tail}"] if len(head) + len(tail) < 118 else [f"{head},", f"  {tail}"]


def _budget_lines(budgets: tuple[int, ...], unit: str) -> list[str]:
    """``  budgets [a, b, ...] unit``, wrapped onto indented lines of at most 119 columns (a derived ladder has a
    rung every 1.25x: twenty and more on a vision bound)."""
    text = "budgets [" + ", ".join(map(str, budgets)) + f"] {unit}"
    return textwrap.wrap(text, 119, initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False)


def _source_lines(source: str) -> list[str]:
    """Where a derived value comes from, wrapped under its line at 119 columns."""
    return textwrap.wrap(source, 119, initial_indent="    ", subsequent_indent="      ")


def _sourced(text: str, source: str) -> str:
    """``text (source)``, or ``text`` alone for a value the block sets."""
    return f"{text} ({source})" if source else text


def _describe_wgrad_accumulation(facts: ModelFacts, vision: Any | None) -> list[str]:
    """Where the weight gradients are summed, graphs on and off alike (:mod:`bridge_cudagraph.host.wgrad_fusion`)."""
    if not facts.gradient_accumulation_fusion:
        lines = ["weight gradients: added to main_grad one parameter at a time (gradient_accumulation_fusion=false)"]
    else:
        lines = ["weight gradients: summed in the language TE layers' GEMMs (the output layer fuses only with APEX)"]
    if vision is not None:
        lines.append("  vision encoder: one at a time, as Bridge builds it (its config leaves the fusion off)")
    return lines


def _modules_text(modules: tuple[str, ...] | None) -> str:
    return "whole layers" if modules is None else "[" + ", ".join(modules) + "]"


def _describe_language(language: Any, facts: ModelFacts) -> list[str]:
    if not language.enabled:
        return [f"language: graphs off ({facts.num_layers} layers run eagerly)"]
    stages = language.captured_per_stage
    if len(stages) == 1:
        layers = plural(stages[0], "layer")
        per = "1 graph each (pp 1)"
    else:
        layers = "+".join(map(str, stages)) + f" layers on {len(stages)} stages"
        per = f"{plural(language.graphs_per_unit, 'graph')} each (one per micro-batch)"
    runs = []
    if language.graph_unit == "run":
        units = "+".join(str(len(s)) for s in language.segments_per_stage)
        layers += f" in {units} run" + ("" if units == "1" else "s")
        merges = f"cut after each of the first {language.deepstack_merges} (a deepstack merge follows)"
        # Stage 0 merges the deepstack features; the later stages look alike, the first of them stands for all.
        runs = [
            f"  runs of layers: {_ranges(spans)}"
            + (f" on stage {stage}" if len(stages) > 1 else "")
            + f"; {merges if stage == 0 and language.deepstack_merges else 'nothing runs between the layers'}"
            for stage, spans in enumerate(language.segments_per_stage[:2])
        ]
    elif language.unit_source:
        runs = [f"  one graph per layer (graph_unit null: {language.unit_source})"]
    packed, padded = language.packed, language.padded
    if packed is not None:
        copies = f" x {packed.copies} in-flight copies" if packed.copies > 1 else ""
        per = f"{plural(len(packed.token_budgets), 'budget')}{copies} each (packed THD)"
    elif padded is not None and len(stages) > 1:
        per = f"{plural(padded.copies, 'graph')} each (in flight)"
    inputs = [s.describe() for s in language.static_inputs]
    head = f"language: {layers} x {per} = {plural(language.graphs, 'graph')} per rank"
    warmup = _sourced(f"capture after {plural(language.warmup_steps, 'step')}", language.warmup_source)
    modules = _sourced(_modules_text(language.modules), language.modules_source)
    lines = [*_joined(head, f"{modules}, {warmup}"), *runs]
    if packed is not None and facts.num_moe_experts:
        lines += [
            "  MoE layers: each graph holds the attention; router, dispatch, experts and combine run eagerly after",
            "    it on the micro-batch's own tokens, the rung's tail kept out of them (counted per rung)",
        ]
    if padded is not None:
        lines.append(
            f"  padded rows on the ladder engine (as the packed and vision graphs): one rung of mbs {padded.rows} x "
            f"S {padded.width}"
        )
    if packed is None:
        lines.append("  static inputs: " + inputs[0])
        lines += ["                 " + s for s in inputs[1:]]
        return lines
    budget_lines = _budget_lines(packed.token_budgets, "tokens")
    if packed.offline:
        budget_lines.append(
            f"    offline-packed rows of S {packed.row_width} (dataset.offline_packing_specs), one per micro-batch"
        )
    elif packed.budgets_derived:
        budget_lines.append(
            f"    derived: mbs {packed.max_tokens // packed.row_width} x S {packed.row_width} = {packed.max_tokens} "
            f"max, {len(packed.token_budgets)} rungs <= {LADDER_RATIO}x apart"
            if len(packed.token_budgets) > 1
            else f"    derived: every row padded to S {packed.row_width} (pp > 1 or ep > 1)"
        )
    if packed.budgets_source:
        budget_lines += _source_lines(packed.budgets_source)
    seqlen = "model.seq_length" if packed.row_width == facts.seq_length else f"S {facts.seq_length} in padded rows"
    if packed.max_seqlen_source:
        seqlen = packed.max_seqlen_source
    lines += [
        *budget_lines,
        "  max sequences per micro-batch "
        + _sourced(str(packed.max_sequences), packed.sequences_source)
        + f", max sequence length {packed.max_seqlen} ({seqlen})",
        "  a micro-batch with more tokens or sequences runs eagerly (counted)",
        f"  tight packing {packed.tight_source}",
    ]
    if packed.deterministic_workspace:
        lines.append(
            f"  deterministic kernels: cuDNN's attention backward workspace about "
            f"{packed.deterministic_workspace / 2**30:.1f} GiB at the top budget (in the pool estimate)"
        )
    budget, largest = packed.static_inputs[-1]
    lines.append(f"  static inputs at T={budget} (each budget the same with its own T):")
    lines += ["    " + x.describe() for x in largest]
    return lines


def _ranges(segments: tuple[tuple[int, int], ...]) -> str:
    """``((0, 1), (1, 2), (2, 28))`` as ``0, 1, 2-27``."""
    return ", ".join(f"{a}-{b - 1}" if b - a > 1 else f"{a}" for a, b in segments)


def _describe_vision(vision: Any, facts: ModelFacts, layout: ResolvedLayout | None) -> list[str]:
    assert facts.vision is not None
    v = facts.vision
    if not vision.enabled:
        return [f"vision: graphs off ({vision.depth} layers run eagerly)"]
    where = ""
    if layout is not None:
        last = layout.rank_offset + layout.size - 1
        where = f" on rank {last}" if layout.size == 1 else f" on ranks {layout.rank_offset}-{last}"
    most = vision.max_patches_per_microbatch
    mbs = most // (facts.seq_length * v.merge_unit)
    budget_lines = _budget_lines(vision.token_budgets, "patches")
    if vision.budgets_derived:
        budget_lines.append(
            f"    derived: S {facts.seq_length} x {v.spatial_merge_size}**2 x mbs {mbs} = {most} max, "
            f"{len(vision.token_budgets)} rungs <= {LADDER_RATIO}x apart"
        )
    if vision.budgets_source:
        budget_lines += _source_lines(vision.budgets_source)
    images_line = f"  max images per micro-batch {vision.max_images_per_microbatch}"
    images_lines = [images_line]
    if vision.images_derived and vision.images_source:
        images_lines = [
            f"{images_line}, derived:",
            *_source_lines(vision.images_source),
        ]
    elif vision.images_derived:
        images_lines[0] += (
            f", derived: {vision.token_budgets[-1]} // ({v.merge_unit} x {MIN_IMAGE_MERGED_TOKENS}) "
            "(images of >= 4x4 merged tokens)"
        )
    patches_line = f"  at most {vision.max_patches_per_image} patches per image (the static attention max_seqlen)"
    if vision.patches_source:
        patches = [
            f"{patches_line}:",
            *_source_lines(vision.patches_source),
        ]
    else:
        patches = [patches_line]
    if vision.deterministic_workspace:
        patches.append(
            f"  deterministic kernels: cuDNN's attention backward workspace about "
            f"{vision.deterministic_workspace / 2**30:.1f} GiB at the top budget (in the pool estimate)"
        )
    copies = f" x {vision.copies} in-flight copies (pipeline stage 0, 1F1B)" if vision.copies > 1 else ""
    if vision.graph_unit == "layer":
        span, spans = plural(vision.depth, "layer"), []
    else:
        span = plural(len(vision.segments), "graph")
        spans = [f"  each budget's graphs span layers {_ranges(vision.segments)} (cut after each deepstack layer)"]
    head = (
        f"vision: {span} x {plural(len(vision.token_budgets), 'budget')}{copies} = "
        f"{plural(vision.graphs, 'graph')} per rank{where}"
    )
    warmup = _sourced(f"capture after {plural(vision.warmup_steps, 'step')}", vision.warmup_source)
    lines = [
        *_joined(head, f"{_modules_text(vision.modules)}, {warmup}"),
        *spans,
        *budget_lines,
        *images_lines,
        *patches,
        f"  a micro-batch with more than {vision.token_budgets[-1]} patches or more images runs eagerly (counted)",
    ]
    budget, largest = vision.static_inputs[-1]
    lines.append(f"  static inputs at B={budget} (each budget the same with its own B):")
    lines += ["    " + x.describe() for x in largest]
    return lines


def _describe_cached_walks(walks: Any) -> list[str]:
    """The optimizer's and the gradient finalisation's walks, done once or as megatron-core does them."""
    if walks.optimizer and walks.grad_finalize:
        return ["optimizer: the step's per-parameter and per-module host work cached (same kernels, same step)"]
    if not walks.optimizer and not walks.grad_finalize:
        return [
            "optimizer: megatron-core's step as it is (cached_walks.optimizer=false, cached_walks.grad_finalize=false)"
        ]
    if walks.optimizer:
        return [
            "optimizer: the step's per-parameter host work cached (same kernels, same step)",
            "  the gradient finalisation walks every module every step (cached_walks.grad_finalize=false)",
        ]
    return [
        "optimizer: megatron-core's step as it is (cached_walks.optimizer=false)",
        "  the gradient finalisation's modules to reset listed once (same resets)",
    ]


#: What each part of ``model.cuda_graph.forward`` does, for the plan's text.
_FORWARD_TEXT = {
    "positions": "mRoPE positions from one host copy",
    "merges": "deepstack and image-token merges by index",
    "flat_rows": "the step's packed rows handed flat",
    "collated_grids": "the grids from the collate's copy",
}


def _describe_forward(forward: Any) -> list[str]:
    """Which parts of Qwen3-VL's forward run this plugin's way, and why each other one is Bridge's."""
    if not forward.off_reasons:
        return [
            "forward: mRoPE positions from one host copy, deepstack and image-token merges by index (same values, no "
            "wait)"
        ]
    bridge = ", ".join(f"{part} ({why})" for part, why in forward.off_reasons)
    if not forward.parts:
        text = f"forward: Bridge's Qwen3-VL forward as it is: {bridge}"
    else:
        ours = ", ".join(_FORWARD_TEXT[part] for part in forward.parts)
        text = f"forward: {ours} (same values, no wait); Bridge's own {bridge}"
    return textwrap.wrap(text, 119, subsequent_indent="  ", break_on_hyphens=False)


def describe_plan(plan: Any) -> str:
    """A readable multi-line block for logs and the CLI (at most 119 columns, no trailing newline). A value the
    plan derived says where it came from, in parentheses; one the block sets is printed as it is."""
    f = plan.facts
    nmb = "n/a" if plan.num_microbatches is None else str(plan.num_microbatches)
    if plan.num_microbatches_source:
        nmb += f" ({plan.num_microbatches_source})"
    gbs = "unset" if plan.global_batch_size is None else str(plan.global_batch_size)
    lines = [
        f"capture plan: {f.provider} on {plural(plan.world_size, 'rank')}, {f.dtype}",
        f"  micro-batch {plan.micro_batch_size}, global batch {gbs}, micro-batches per step {nmb}",
        format_layout(list(plan.layouts)),
    ]
    lines += _describe_language(plan.language, f)
    if plan.vision is not None:
        lines += _describe_vision(plan.vision, f, plan.vision_layout)
    if plan.language.enabled or (plan.vision is not None and plan.vision.enabled):
        lines += _describe_cached_walks(plan.cached_walks)
        if plan.vision is not None:
            lines += _describe_forward(plan.forward)
        if plan.switches_defaulted:
            text = f"on wherever graphs are (left null): {', '.join(plan.switches_defaulted)}"
            lines += textwrap.wrap(text, 119, initial_indent="  ", subsequent_indent="    ")
        lines += _describe_wgrad_accumulation(f, plan.vision)
        if plan.memory is not None:
            lines += plan.memory.describe()
        lines.append(
            f"busiest rank: {plural(plan.total_graphs, 'graph')}; a failed capture "
            + ("trains on eagerly (on_capture_error=eager)" if plan.on_capture_error == "eager" else "stops")
        )
    return "\n".join(lines)
