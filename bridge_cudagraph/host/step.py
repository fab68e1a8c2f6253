"""The graphed step's host changes, put on and taken off together: what ``model.cuda_graph.cached_walks`` and
``model.cuda_graph.forward`` switch (null: on wherever graphs are).

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

from collections.abc import Iterable
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
        forward: What :func:`bridge_cudagraph.host.forward.install` put on, and its counts (empty: nothing).
    """

    optimizer: list[tuple[Any, type]] = field(default_factory=list)
    finalize_config: Any | None = None
    forward: forward_host.ForwardInstall = field(default_factory=forward_host.ForwardInstall)


def install(
    model_chunks: list[Any],
    optimizer: Any,
    *,
    optimizer_walks: bool = True,
    finalize_walk: bool = True,
    forward: Iterable[str] = (),
) -> StepHostCaches:
    """Put the optimizer's walks done once on ``optimizer`` (``optimizer_walks``), the gradient finalisation's walk
    done once on the config of ``model_chunks`` where it has a finalisation function (``finalize_walk``), and the parts
    of Qwen3-VL's forward named in ``forward`` (:data:`bridge_cudagraph.host.forward.MECHANISMS`) on its models."""
    from megatron.core.utils import get_model_config

    installed = StepHostCaches()
    if optimizer_walks:
        installed.optimizer = optimizer_host.install(optimizer)
    if finalize_walk and model_chunks:
        config = get_model_config(model_chunks[0])
        if finalize_host.install(config, model_chunks):
            installed.finalize_config = config
    if forward:
        installed.forward = forward_host.install(model_chunks, forward)
    return installed


def install_planned(plan: CapturePlan, model_chunks: list[Any], optimizer: Any) -> StepHostCaches:
    """:func:`install` as ``plan`` says (``cached_walks``, ``forward``)."""
    return install(
        model_chunks,
        optimizer,
        optimizer_walks=plan.cached_walks.optimizer,
        finalize_walk=plan.cached_walks.grad_finalize,
        forward=plan.forward.parts,
    )


def uninstall(installed: StepHostCaches) -> None:
    """Undo :func:`install` (idempotent)."""
    if installed.optimizer:
        optimizer_host.uninstall(installed.optimizer)
        installed.optimizer = []
    if installed.finalize_config is not None:
        finalize_host.uninstall(installed.finalize_config)
        installed.finalize_config = None
    forward_host.uninstall(installed.forward)
