"""The plan of a model a test or the benchmark builds itself from a provider, without a ``ConfigContainer``.

A run from a recipe plans through :func:`bridge_cudagraph.plan.from_config.plan_config`, the one entry point, which
also finalizes the config and runs the run-level checks; a harness that calls ``provider.provide()`` itself has no
config to finalize, only the provider's facts and block.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bridge_cudagraph.plan.build import build_plan
from bridge_cudagraph.plan.capture_plan import CapturePlan
from bridge_cudagraph.plan.facts import model_facts


def plan_for(provider: Any, *, world_size: int, micro_batch_size: int, num_microbatches: int) -> CapturePlan:
    """The plan of ``provider``: its own facts and block, with the micro-batch count the caller's schedule runs."""
    cfg = dataclasses.replace(provider.cuda_graph, num_microbatches=num_microbatches)
    return build_plan(
        model_facts(provider), cfg, world_size=world_size, micro_batch_size=micro_batch_size, global_batch_size=None
    )
