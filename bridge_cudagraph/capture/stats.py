"""The numbers one submodule's capture reports: graphs, layers, wall time, memory per rung, replays and eager
fallbacks (for the rank-0 summary, the benchmark and the parity records)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CaptureStats"]


@dataclass
class CaptureStats:
    """What one submodule's capture did, for the rank-0 summary and the benchmark."""

    submodule: str
    graphs: int = 0
    layers: int = 0
    seconds: float = 0.0
    graph_memory_bytes: int = 0
    """Growth of the CUDA caching allocator's reserved memory across capture: the graphs' private pools
    plus their static input/output buffers."""
    replays: int = 0
    eager_fallbacks: int = 0
    failed: str | None = None
    """The cause, when capture failed and the run went on eagerly."""
    per_budget: dict[int, int] = field(default_factory=dict)
    """Growth of reserved memory each token budget's capture caused (bytes), in capture order: the first (largest)
    rung holds the pool every smaller rung reuses, so later rungs add only what they keep alive."""
    per_budget_live: dict[int, int] = field(default_factory=dict)
    """Of :attr:`per_budget`, the growth of allocated memory: tensors a rung keeps alive after its capture (static
    inputs and gradient outputs, the buffers TE still holds); the rest is the pool's share of the rung."""
    budgets_captured: tuple[int, ...] = ()
    """The rungs of the ladder captured so far, ascending."""
    budget_source: str = ""
    """Why these rungs: the largest micro-batch the warmup steps showed, or the whole ladder when none was seen."""
    late_captures: int = 0
    """Rungs captured after the first capture, when a micro-batch above the captured top asked for them."""
    above_captured: int = 0
    """Eager micro-batches of :attr:`eager_fallbacks` that were above the captured top (their rung came later, or
    did not fit in memory)."""
    param_grads_cloned: bool | None = None
    """Whether each backward replay clones the parameter gradients it returns (TE's default, kept at every capture:
    :func:`~bridge_cudagraph.capture.ladder_capture.capture_budget_ladder` says why); False once graphs of their own
    sum them (:attr:`param_grads_summed`)."""
    param_grads_summed: int = 0
    """Parameter gradients a backward pass over one rung's graphs sums into ``main_grad`` in small graphs of its own
    (:mod:`bridge_cudagraph.capture.param_grads`), instead of autograd and DDP's hook one by one; 0: none."""
    moe_tail_tokens: dict[int, int] = field(default_factory=dict)
    """Per rung, the tail tokens of packed MoE replays, which the MoE layers' eager halves never saw (they run on the
    micro-batch's real rows, :mod:`bridge_cudagraph.capture.moe_layers`); empty for a dense model."""
