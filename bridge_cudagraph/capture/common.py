"""What the language and the vision capture share: shape checks, the explicit micro-batch count,
dtype, failure handling and the numbers a capture reports."""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

logger = logging.getLogger("bridge_cudagraph")


class CaptureError(RuntimeError):
    """A configuration that cannot be captured as asked, found before any graph is built."""


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
    """Vision: graph memory each token budget added (bytes), in capture order (largest budget first)."""
    param_grads_cloned: bool | None = None
    """Whether each backward replay clones the parameter gradients it returns (TE's default); False when
    Megatron's DDP consumes them before the buffers can be written again (:func:`param_grad_return_kwargs`)."""
    param_grads_per_graph: bool | None = None
    """Whether each graph's parameter gradients go to ``main_grad`` once per replay
    (:mod:`~bridge_cudagraph.capture.grad_sink`) rather than through a node and a DDP hook per parameter."""


def activation_dtype(config) -> torch.dtype:
    """The dtype activations have inside the layers: Float16Module casts to bf16/fp16, else fp32.

    Megatron-Core's static inputs are hard-coded bf16 (``module.py`` ``get_layer_static_inputs``); TE then
    converts fp16/fp32 activations into that buffer *silently* at replay, losing precision.
    """
    if getattr(config, "fp16", False):
        return torch.float16
    if getattr(config, "bf16", False):
        return torch.bfloat16
    return torch.float32


def check_static_inputs(tensors: Mapping[str, Any], planned: Sequence[Any], submodule: str) -> None:
    """The buffers capture is about to use must be the plan's :class:`~bridge_cudagraph.plan.StaticInput` s.

    The plan is what ``bridge-cudagraph plan`` printed and what memory was budgeted for; a buffer of another shape
    or dtype means the plan and the model disagree, and capture stops with both instead of replaying something
    else. Inputs the plan lists but the layer does not take (``tensors`` lacks them) are not checked here.
    """
    for want in planned:
        tensor = tensors.get(want.name)
        if tensor is None:
            continue
        dtype = getattr(torch, want.torch_dtype_name)
        if tuple(tensor.shape) != tuple(want.shape) or tensor.dtype != dtype:
            raise CaptureError(
                f"{submodule}: static input {want.name} is {tuple(tensor.shape)} {tensor.dtype} but the capture plan "
                f"says {want.describe()}; the plan and the model disagree (build the plan from the finalized config)"
            )


def check_group_sizes(config, pg_collection, submodule: str) -> None:
    """Static capture shapes come from ``config.*_parallel_size``; the kernels run on the collection's groups.

    When the two disagree the captured buffers have the wrong shape and replay fails with a shape error
    deep inside TE, or - worse - broadcasts. Say so before capture.
    """
    pairs = [
        ("tensor_model_parallel_size", pg_collection.tp),
        ("context_parallel_size", pg_collection.cp),
        ("pipeline_model_parallel_size", pg_collection.pp),
    ]
    for attr, group in pairs:
        want = int(getattr(config, attr, 1) or 1)
        have = group.size() if group is not None else 1
        if want != have:
            raise CaptureError(
                f"{submodule}: config.{attr} = {want} but its process-group collection has a group of size {have}; "
                f"build the {submodule} groups from the same layout as the model config "
                "(bridge_cudagraph.groups.build_collections) or set the config to match"
            )
    if pg_collection.dp_cp is None:
        raise CaptureError(
            f"{submodule}: the process-group collection has no dp_cp group; Megatron-Core's helper logs on it and "
            "raises without it. Build the collection with bridge_cudagraph.groups, which sets every field"
        )


def ddp_consumes_param_grads(model_chunks, modules) -> bool:
    """Whether every trainable parameter of ``modules`` is owned by a megatron-core DDP chunk of ``model_chunks``.

    Such a parameter's gradient is consumed by DDP's hook on its ``AccumulateGrad`` node (added to ``main_grad``,
    unless TE already did, then ``param.grad = None``). The autograd engine runs ``AccumulateGrad`` nodes before
    any other ready node, so this happens before the next graph's backward is even launched, and on the same
    stream, so before any replay can write the buffer the gradient aliases.
    """
    from megatron.core.distributed import DistributedDataParallel

    owned: set[int] = set()
    for chunk in model_chunks:
        if not isinstance(chunk, DistributedDataParallel):
            return False
        owned.update(id(p) for p in getattr(chunk, "param_to_bucket_group", {}))
    return all(id(p) in owned for module in modules for p in module.parameters() if p.requires_grad)


def param_grad_return_kwargs(model_chunks, modules) -> dict[str, bool]:
    """``make_graphed_callables`` arguments that skip TE's clone of returned parameter gradients, when safe.

    TE 2.20 clones each parameter gradient a backward replay returns, so that a later replay cannot overwrite a
    gradient someone kept. Under Megatron's DDP nobody keeps one (:func:`ddp_consumes_param_grads`): the clone is
    one allocation and one device copy per captured parameter per micro-batch (most of them full-size copies of
    the placeholder TE returns for weights it accumulated into ``main_grad`` itself), with values identical
    either way. Empty (TE's default) for any other owner of the parameters.
    """
    from bridge_cudagraph.compat import te_graphs_can_alias_param_grads

    if te_graphs_can_alias_param_grads() and ddp_consumes_param_grads(model_chunks, modules):
        return {"clone_param_grads_on_return": False}
    return {}


@contextlib.contextmanager
def measure(stats: CaptureStats) -> Iterator[None]:
    """Record capture wall time and the growth of reserved CUDA memory into ``stats``."""
    import gc

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # so the baseline holds live tensors only, not blocks the capture will free anyway
    reserved = torch.cuda.memory_reserved()
    start = time.perf_counter()
    try:
        yield
    finally:
        torch.cuda.synchronize()
        stats.seconds = time.perf_counter() - start
        stats.graph_memory_bytes = max(0, torch.cuda.memory_reserved() - reserved)


@contextlib.contextmanager
def megatron_capturing() -> Iterator[None]:
    """Raise megatron-core's process-wide "capturing" flag around a capture megatron-core does not run itself.

    Megatron's DDP gradient hooks return early while the flag is up (``distributed_data_parallel.py``
    ``_make_backward_post_hook``). TE 2.20 captures a backward with ``torch.autograd.backward``, which runs the
    parameters' ``AccumulateGrad`` nodes and so those hooks; without the flag a hook would add the gradient to
    ``main_grad`` inside the graph and set ``param.grad = None``, so the graph would hand back no parameter
    gradients and, at replay, no hook would ever tell DDP a gradient is ready: with ``overlap_grad_reduce`` the
    bucket's reduce is never issued ("Communication call has not been issued for this bucket", seen on the H200).
    megatron-core's own helper raises the same flag around its capture (``_start_capturing``).
    """
    from megatron.core.transformer import cuda_graphs

    cuda_graphs._set_capture_start()
    try:
        yield
    finally:
        cuda_graphs._set_capture_end()


def abandon_capture(layers, model_chunks, error: BaseException, submodule: str) -> str:
    """Leave the model training eagerly after a failed capture, as if graphs had never been asked for.

    Clears the global "capturing" flag megatron-core set, drops any half-made graphs from the layers,
    and zeroes the gradient buffers the warmup iterations wrote into.
    """
    from megatron.core.transformer import cuda_graphs

    cuda_graphs._set_capture_end()
    for layer in layers:
        for graph in getattr(layer, "cuda_graphs", []) or []:
            reset = getattr(graph, "reset", None)
            if reset is not None:
                with contextlib.suppress(Exception):
                    reset()
        layer.cuda_graphs = []
        layer.cuda_graph_manual_hooks = []
    zero_grad_buffers(model_chunks)
    with contextlib.suppress(Exception):
        torch.cuda.synchronize()
    cause = f"{type(error).__name__}: {error}".splitlines()[0][:500]
    logger.warning("bridge_cudagraph: %s capture failed, training on eagerly. Cause: %s", submodule, cause)
    return cause


def zero_grad_buffers(model_chunks) -> None:
    """Zero the DDP gradient buffers of ``model_chunks``: TE's warmup passes before a capture wrote gradients into
    them, which megatron-core's helper clears the same way."""
    for chunk in model_chunks:
        zero = getattr(chunk, "zero_grad_buffer", None)
        if zero is not None:
            zero()


def fused_grad_params(layers) -> list:
    """The parameters of ``layers`` whose weight gradient TE accumulates into ``main_grad`` inside a graph (TE's
    Python marked them ``grad_added_to_main_grad`` during capture); a replay runs no TE Python, so the budgeted
    helpers mark them again before each replay."""
    return [p for layer in layers for p in layer.parameters() if getattr(p, "grad_added_to_main_grad", False)]


def sink_param_grads(stats: CaptureStats, model_chunks, graphs: list, units: list) -> list:
    """``graphs`` (one per module of ``units``) with each graph's parameter gradients summed into ``main_grad`` once
    per replay (:func:`~bridge_cudagraph.capture.grad_sink.sink_graphs`), where megatron-core's DDP owns every
    parameter of ``units``; else ``graphs`` as they are. Records which in ``stats``."""
    from bridge_cudagraph.capture.grad_sink import GradSink, sink_graphs

    sunk = graphs
    if ddp_consumes_param_grads(model_chunks, units):
        sunk = sink_graphs(graphs, [list(unit.parameters()) for unit in units], model_chunks)
    done = all(isinstance(g, GradSink) for g in sunk)
    stats.param_grads_per_graph = done and stats.param_grads_per_graph is not False  # every call of a capture
    return sunk


def reset_graph_sets(graphs) -> None:
    """Free the TE graphs of ``{budget: [graph set, ...]}`` (each set's ``layers`` are TE graphed callables,
    whose ``reset()`` releases their graph state)."""
    for copies in graphs.values():
        for graph_set in copies:
            for graph in graph_set.layers:
                reset = getattr(graph, "reset", None)
                if reset is not None:
                    reset()


class LayerChain(torch.nn.Module):
    """Graphable per-layer callables of one signature ``(hidden_states, *static) -> hidden_states`` one after the
    other, as one callable: a segment of ``graph_unit: deepstack`` (:func:`~bridge_cudagraph.budgets.layer_segments`)
    in the budgeted helpers (vision, packed language). Every link reads the same static inputs, and only the last
    output is read outside (a segment ends wherever other code reads or changes the hidden states), so the chain is
    one launch and one backward node instead of one per layer, and no copy of each layer's output into the next
    graph's static input."""

    def __init__(self, links: Sequence[torch.nn.Module]) -> None:
        super().__init__()
        self.links = torch.nn.ModuleList(links)

    def forward(self, hidden_states: torch.Tensor, *static: torch.Tensor) -> torch.Tensor:
        for link in self.links:
            hidden_states = link(hidden_states, *static)
        return hidden_states


def segment_callables(layers: Sequence[torch.nn.Module], segments, wrap) -> tuple[torch.nn.Module, ...]:
    """One callable per segment ``[start, end)`` of ``layers``: ``wrap(layer)`` alone, or a :class:`LayerChain` of
    them."""
    return tuple(
        wrap(layers[start]) if end - start == 1 else LayerChain([wrap(layer) for layer in layers[start:end]])
        for start, end in segments
    )


class GraphCopies:
    """Which of ``count`` independent graph sets are free, for schedules that keep micro-batches in flight.

    A set is taken by a micro-batch's forward and given back when that micro-batch's backward reaches the sets'
    output. A backward runs to completion before the schedule starts another forward, so giving the set back as
    the gradient arrives (just before the layers' backward graphs replay) is safe. Without a backward through
    the graphs (no gradient needed), the set is free again at once.
    """

    def __init__(self, count: int) -> None:
        if count < 1:
            raise CaptureError(f"vision graph copies must be >= 1, got {count}")
        self.count = count
        self._busy = [False] * count

    def acquire(self) -> int | None:
        """A free set, marked busy; None when every set is in flight."""
        for index, busy in enumerate(self._busy):
            if not busy:
                self._busy[index] = True
                return index
        return None

    def release_after_backward(self, index: int, output: torch.Tensor) -> None:
        """Free set ``index`` when the gradient of ``output`` (the sets' last output) is computed."""
        if torch.is_grad_enabled() and output.requires_grad:

            def free(grad, index=index):
                self._busy[index] = False
                return grad

            output.register_hook(free)
        else:
            self._busy[index] = False

    def release_now(self, index: int) -> None:
        """Free set ``index`` at once (a forward that took it and failed before any replay)."""
        self._busy[index] = False

    def in_flight(self) -> int:
        """Sets taken by micro-batches whose backward has not reached them yet."""
        return sum(self._busy)

    def reset(self) -> None:
        """Every set free (after capture, deletion, or an aborted step)."""
        self._busy = [False] * self.count


def capture_budget_ladder(
    *,
    stats: CaptureStats,
    model_chunks,
    layers,
    budgets,
    copies: int,
    capture_one,
    on_capture_error: str,
    submodule: str,
) -> tuple[dict, list]:
    """Capture one graph set per budget and copy, as the budgeted helpers (packed language, vision) do; returns
    ``(graphs, fused_params)``: ``{budget: [graph set per copy]}`` and :func:`fused_grad_params` of ``layers``.

    Each copy has a pool of its own, and its budgets are captured into it largest first: a budget's activations
    are freed into the pool once its backward is captured, and the caching allocator splits a free block but
    never joins two, so each smaller budget is carved out of the larger one's memory. That is safe because one
    copy holds one micro-batch at a time and only one budget runs per micro-batch; copies never share (they hold
    micro-batches in flight at once). ``capture_one(budget, pool, extra_kwargs)`` captures one set.

    On failure: re-raised with ``on_capture_error="raise"``, else the model is left eager
    (:func:`abandon_capture`, the cause in ``stats.failed``) and ``({}, [])`` comes back.
    """
    try:
        with measure(stats), megatron_capturing():
            skip_clones = param_grad_return_kwargs(model_chunks, layers)
            stats.param_grads_cloned = not skip_clones
            pools = [torch.cuda.graph_pool_handle() for _ in range(copies)]
            captured = {}
            for budget in sorted(budgets, reverse=True):
                before = torch.cuda.memory_reserved()
                captured[budget] = [capture_one(budget, pool, skip_clones) for pool in pools]
                torch.cuda.synchronize()
                stats.per_budget[budget] = torch.cuda.memory_reserved() - before
            fused = fused_grad_params(layers)
            zero_grad_buffers(model_chunks)
            gc.collect()
    except Exception as error:
        if on_capture_error == "raise":
            raise
        stats.failed = abandon_capture(layers, model_chunks, error, submodule)
        return {}, []
    graphs = dict(sorted(captured.items()))
    stats.graphs = sum(len(g.layers) for sets in graphs.values() for g in sets)
    return graphs, fused
