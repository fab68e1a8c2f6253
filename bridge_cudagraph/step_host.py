"""The graphed step's host caches, put on and taken off together: what ``model.cuda_graph.optimizer_host_cache``
switches (null: on wherever graphs are).

Two pieces of per-step host work that recompute the same answer every step and leave the GPU idle between the
backward and the optimizer: megatron-core's module walk at the end of the gradient finalisation
(:mod:`bridge_cudagraph.finalize_host`) and the optimizer step's per-parameter walks
(:mod:`bridge_cudagraph.optimizer_host`). Both keep the host's kernels and arguments, so a step is bitwise the
host's. Bridge's callback installs them at ``on_train_start`` and takes them off with the graphs; the benchmark
installs them for its ``ours`` variants through the same function.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bridge_cudagraph import finalize_host, optimizer_host

__all__ = ["StepHostCaches", "install", "uninstall"]


@dataclass
class StepHostCaches:
    """What :func:`install` changed, for :func:`uninstall`.

    Attributes:
        optimizer: The optimizer objects given a mixin (:func:`bridge_cudagraph.optimizer_host.install`).
        finalize_config: The model config whose ``finalize_model_grads_func`` was wrapped, or None.
    """

    optimizer: list[tuple[Any, type]] = field(default_factory=list)
    finalize_config: Any | None = None


def install(model_chunks: list[Any], optimizer: Any, *, finalize: bool = True) -> StepHostCaches:
    """Put both caches on ``model_chunks`` (their config's finalisation function, where one is set) and
    ``optimizer``; ``finalize=False`` leaves the finalisation as it is (the benchmark's lever)."""
    from megatron.core.utils import get_model_config

    done = StepHostCaches(optimizer=optimizer_host.install(optimizer))
    if finalize and model_chunks:
        config = get_model_config(model_chunks[0])
        if finalize_host.install(config, model_chunks):
            done.finalize_config = config
    return done


def uninstall(done: StepHostCaches) -> None:
    """Undo :func:`install` (idempotent)."""
    if done.optimizer:
        optimizer_host.uninstall(done.optimizer)
        done.optimizer = []
    if done.finalize_config is not None:
        finalize_host.uninstall(done.finalize_config)
        done.finalize_config = None
