"""The graphed step's host work, put on and taken off together: what ``model.cuda_graph.optimizer_host_cache`` and
``model.cuda_graph.fewer_host_waits`` switch (null: on wherever graphs are).

Host change:
  changes: nothing of its own: puts on and takes off :mod:`~bridge_cudagraph.host.finalize`,
    :mod:`~bridge_cudagraph.host.optimizer` and :mod:`~bridge_cudagraph.host.forward` together
  written for: as those three
  gate: as those three
  undo: :func:`uninstall`

Per-step host work that recomputes the same answer every step or waits for the GPU where it need not, leaving the
GPU idle: megatron-core's module walk at the end of the gradient finalisation (:mod:`bridge_cudagraph.host.finalize`)
and the optimizer step's per-parameter walks (:mod:`bridge_cudagraph.host.optimizer`), which keep the host's kernels
and arguments, and Qwen3-VL's forward waits (:mod:`bridge_cudagraph.host.forward`), which keep its values. A step is
bitwise the host's. Bridge's callback installs them at ``on_train_start`` as the plan says and takes them off with
the graphs; the benchmark installs them for its ``ours`` variants through the same function.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bridge_cudagraph.host import finalize as finalize_host
from bridge_cudagraph.host import forward as forward_host
from bridge_cudagraph.host import optimizer as optimizer_host

if TYPE_CHECKING:
    from bridge_cudagraph.plan.capture_plan import CapturePlan

__all__ = ["StepHostCaches", "install", "install_planned", "uninstall"]


@dataclass
class StepHostCaches:
    """What :func:`install` changed, for :func:`uninstall`.

    Attributes:
        optimizer: The optimizer objects given a mixin (:func:`bridge_cudagraph.host.optimizer.install`).
        finalize_config: The model config whose ``finalize_model_grads_func`` was wrapped, or None.
        forward: The model objects given a mixin (:func:`bridge_cudagraph.host.forward.install`).
    """

    optimizer: list[tuple[Any, type]] = field(default_factory=list)
    finalize_config: Any | None = None
    forward: list[tuple[Any, type]] = field(default_factory=list)


def install(
    model_chunks: list[Any], optimizer: Any, *, caches: bool = True, finalize: bool = True, forward: bool = False
) -> StepHostCaches:
    """Put the optimizer and finalisation caches on ``model_chunks`` (their config's finalisation function, where
    one is set) and ``optimizer`` (``caches``; ``finalize=False`` leaves the finalisation as it is: the benchmark's
    lever), and Qwen3-VL's forward with fewer host waits on the models in ``model_chunks`` (``forward``)."""
    from megatron.core.utils import get_model_config

    done = StepHostCaches()
    if caches:
        done.optimizer = optimizer_host.install(optimizer)
        if finalize and model_chunks:
            config = get_model_config(model_chunks[0])
            if finalize_host.install(config, model_chunks):
                done.finalize_config = config
    if forward:
        done.forward = forward_host.install(model_chunks)
    return done


def install_planned(
    plan: CapturePlan, model_chunks: list[Any], optimizer: Any, *, finalize: bool = True
) -> StepHostCaches:
    """:func:`install` as ``plan`` says (``optimizer_host_cache``, ``fewer_host_waits``)."""
    return install(
        model_chunks, optimizer, caches=plan.optimizer_host_cache, finalize=finalize, forward=plan.fewer_host_waits
    )


def uninstall(done: StepHostCaches) -> None:
    """Undo :func:`install` (idempotent)."""
    if done.optimizer:
        optimizer_host.uninstall(done.optimizer)
        done.optimizer = []
    if done.finalize_config is not None:
        finalize_host.uninstall(done.finalize_config)
        done.finalize_config = None
    if done.forward:
        forward_host.uninstall(done.forward)
        done.forward = []
