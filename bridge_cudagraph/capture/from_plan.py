"""The graph helpers a plan asks for, built with exactly the plan's numbers: nothing is re-derived here.

A provider of this package hands its model and its :class:`~bridge_cudagraph.plan.capture_plan.CapturePlan` here
(:meth:`~bridge_cudagraph.bridge.mixin.CudaGraphProviderMixin.make_graph_helpers`); the plan must be the provider's
own (:func:`check_plan_matches`), and each helper's arguments are the plan's (:func:`packed_helper_arguments`,
:func:`padded_helper_arguments`, :func:`vision_helper_arguments`), which the unit tests pin per recipe.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from bridge_cudagraph.config import CudaGraphConfigError

if TYPE_CHECKING:
    from bridge_cudagraph.plan.capture_plan import CapturePlan

__all__ = [
    "check_plan_matches",
    "graph_helpers",
    "language_graph_helper",
    "packed_helper_arguments",
    "padded_helper_arguments",
    "vision_helper_arguments",
]


def graph_helpers(provider: Any, model: list[Any], *, plan: CapturePlan) -> list[Any]:
    """Every helper ``plan`` asks for, language first; a later pipeline stage has no vision encoder, so no vision
    helper."""
    check_plan_matches(provider, plan)
    helpers = []
    if plan.language.enabled:
        helpers.append(language_graph_helper(model, plan=plan))
    if plan.vision is not None and plan.vision.enabled:
        from bridge_cudagraph.capture.vision import VisionGraphHelper
        from bridge_cudagraph.vision.encoder import GraphedQwen3VLVisionModel

        encoders = [m for chunk in model for m in chunk.modules() if isinstance(m, GraphedQwen3VLVisionModel)]
        if encoders:  # else a later pipeline stage: no encoder here
            helpers.append(VisionGraphHelper(model, encoders[0], **vision_helper_arguments(plan)))
    return helpers


def language_graph_helper(model: list[Any], *, plan: CapturePlan):
    """The ladder's language graph helper for ``model``: packed rows where the data path packs, else padded rows."""
    if plan.language.packed is not None:
        from bridge_cudagraph.capture.packed import PackedLanguageGraphHelper

        return PackedLanguageGraphHelper(model, **packed_helper_arguments(plan))
    from bridge_cudagraph.capture.padded import PaddedLanguageGraphHelper

    return PaddedLanguageGraphHelper(model, **padded_helper_arguments(plan))


def check_plan_matches(provider: Any, plan: CapturePlan) -> None:
    """Refuse a plan built for another block or model: the helpers must be built from this provider's own plan.

    Compares the model facts the plan was built from with this provider's (``dtype`` aside: it depends on the run's
    mixed-precision recipe, which the provider alone does not know) and the ``cuda_graph`` switches.
    """
    from bridge_cudagraph.plan.facts import model_facts

    facts = dataclasses.replace(model_facts(provider), dtype=plan.facts.dtype)
    vision_on = plan.vision is not None and plan.vision.enabled
    block = provider.cuda_graph
    if facts != plan.facts or (block.language.enabled, block.vision.enabled) != (plan.language.enabled, vision_on):
        changed = sorted(
            f.name for f in dataclasses.fields(facts) if getattr(facts, f.name) != getattr(plan.facts, f.name)
        )
        raise CudaGraphConfigError(
            f"the capture plan was built for another configuration than {type(provider).__name__} has now (differs: "
            f"{', '.join(changed) or 'cuda_graph enabled switches'}); build the plan from the finalized config "
            "(bridge_cudagraph.plan.from_config.plan_config) and change nothing after"
        )


def packed_helper_arguments(plan: CapturePlan) -> dict[str, Any]:
    """The :class:`~bridge_cudagraph.capture.packed.PackedLanguageGraphHelper` arguments ``plan`` decides."""
    packed = plan.language.packed
    if packed is None:
        raise CudaGraphConfigError("the capture plan has no packed language graphs")
    return {
        "layout": packed.layout,
        "separate_padded": packed.separate_padded,
        "copies": packed.copies,
        "static_inputs": dict(packed.static_inputs),
        "on_capture_error": plan.on_capture_error,
        "graph_unit": plan.language.graph_unit,
        "deepstack_merges": plan.language.deepstack_merges,
        "tight": packed.tight,
    }


def padded_helper_arguments(plan: CapturePlan) -> dict[str, Any]:
    """The :class:`~bridge_cudagraph.capture.padded.PaddedLanguageGraphHelper` arguments ``plan`` decides."""
    padded = plan.language.padded
    if padded is None:
        raise CudaGraphConfigError("the capture plan has no padded language graphs on the ladder")
    return {
        "rows": padded.rows,
        "width": padded.width,
        "copies": padded.copies,
        "static_inputs": padded.static_inputs,
        "on_capture_error": plan.on_capture_error,
        "graph_unit": plan.language.graph_unit,
        "deepstack_merges": plan.language.deepstack_merges,
    }


def vision_helper_arguments(plan: CapturePlan) -> dict[str, Any]:
    """The :class:`~bridge_cudagraph.capture.vision.VisionGraphHelper` arguments ``plan`` decides."""
    vision = plan.vision
    if vision is None or not vision.enabled:
        raise CudaGraphConfigError("the capture plan has no vision graphs")
    return {
        "budgets": list(vision.token_budgets),
        "max_segments": vision.max_images_per_microbatch,
        "max_seqlen": vision.max_patches_per_image,
        "copies": vision.copies,
        "graph_unit": vision.graph_unit,
        "static_inputs": dict(vision.static_inputs),
        "on_capture_error": plan.on_capture_error,
    }
