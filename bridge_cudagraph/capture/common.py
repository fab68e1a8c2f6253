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

from bridge_cudagraph.capture.param_grads import sum_param_grads

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
    :func:`capture_budget_ladder` says why); False once graphs of their own sum them (:attr:`param_grads_summed`)."""
    param_grads_summed: int = 0
    """Parameter gradients a backward pass over one rung's graphs sums into ``main_grad`` in small graphs of its own
    (:mod:`bridge_cudagraph.capture.param_grads`), instead of autograd and DDP's hook one by one; 0: none."""


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
    """The buffers capture is about to use must be the plan's static inputs
    (:class:`~bridge_cudagraph.plan.capture_plan.StaticInput`).

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
                "(bridge_cudagraph.parallel.groups.build_collections) or set the config to match"
            )
    if pg_collection.dp_cp is None:
        raise CaptureError(
            f"{submodule}: the process-group collection has no dp_cp group; Megatron-Core's helper logs on it and "
            "raises without it. Build the collection with bridge_cudagraph.parallel.groups, which sets every field"
        )


def ladder_order_kwargs(callables: int) -> dict:
    """``make_graphed_callables`` arguments under which one capture of ``callables`` chained graphs (a rung) gives
    back to its pool, once its backward is captured, the memory of everything no later replay of that rung reads:
    the forward's static outputs and the consumed gradient buffers (TE's ``_order`` path with
    ``_reuse_graph_input_output_buffers``, one model chunk, one micro-batch: forward, then backward). The next rung
    captured into the pool is carved out of it, so a ladder costs about one rung of memory
    (:func:`capture_budget_ladder` has the safety argument). Empty where TE lacks the path
    (:func:`bridge_cudagraph.host.compat.te_graphs_share_ladder_buffers`): each rung then keeps its own."""
    from bridge_cudagraph.host.compat import te_graphs_share_ladder_buffers

    if not te_graphs_share_ladder_buffers():
        return {}
    return {"_order": [1, -1], "_num_layers_per_chunk": [callables], "_reuse_graph_input_output_buffers": True}


def held_reserved() -> int:
    """The caching allocator's reserved bytes once the device is idle and its unused cached blocks are given back:
    what live tensors and graph pools hold (the one way captures, the benchmarks and the tests count pool memory)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved()


@contextlib.contextmanager
def measure(stats: CaptureStats, *, add: bool = False) -> Iterator[None]:
    """Record capture wall time and the growth of reserved CUDA memory into ``stats`` (``add``: on top of what an
    earlier capture of the same helper recorded)."""
    gc.collect()
    reserved = held_reserved()  # the baseline holds live tensors only, not blocks the capture will free anyway
    start = time.perf_counter()
    try:
        yield
    finally:
        grown = max(0, held_reserved() - reserved)  # the warmups' cached blocks are no graph memory
        seconds = time.perf_counter() - start  # up to the capture's last kernel, which held_reserved waited for
        stats.seconds = stats.seconds + seconds if add else seconds
        stats.graph_memory_bytes = stats.graph_memory_bytes + grown if add else grown


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
    from bridge_cudagraph.host.compat import set_graph_capturing

    set_graph_capturing(True)
    try:
        yield
    finally:
        set_graph_capturing(False)


def abandon_capture(layers, model_chunks, error: BaseException, submodule: str) -> str:
    """Leave the model training eagerly after a failed capture, as if graphs had never been asked for.

    Clears the global "capturing" flag megatron-core set, drops any half-made graphs from the layers,
    and zeroes the gradient buffers the warmup iterations wrote into.
    """
    from bridge_cudagraph.host.compat import set_graph_capturing

    set_graph_capturing(False)
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
    other, as one callable: a segment of ``graph_unit: run``
    (:func:`~bridge_cudagraph.plan.budgets.layer_segments`) in the budgeted helpers (vision, packed language). Every
    link reads the same static inputs, and only the last output is read outside (a segment ends wherever other code
    reads or changes the hidden states), so the chain is one launch and one backward node instead of one per layer, and
    no copy of each layer's output into the next graph's static input."""

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


class BudgetLadder:
    """Which rungs of a token-budget ladder are captured: chosen from the sizes the data showed, never a silent cap.

    Before the first capture every eager training micro-batch reports its size (:meth:`observe`; a shape, read on
    the host without waiting for the GPU). The first capture takes the rungs up to the one that holds the largest
    (:meth:`first_rungs`), every rung when nothing was seen (no warmup step, or no packed micro-batch). A micro-batch
    above the captured top runs eagerly, counted by its helper, and asks for its rung (:meth:`want`); before the next
    training step the lifecycle captures the rungs up to it (:meth:`pending`), or, where they do not fit in memory,
    refuses them once (:meth:`refuse`) and such micro-batches go on running eagerly, counted.

    A ladder's budgets are its *possible* rungs (``micro batch x seq_length`` at the top); photo micro-batches of
    the 2B recipe pack to 692-1386 tokens, so the data needs a fraction of the top, and the pool's memory follows the
    captured top (activations grow linearly with it).
    """

    def __init__(self, budgets: Sequence[int]) -> None:
        self.budgets = tuple(sorted(int(b) for b in budgets))
        self.seen = 0
        self.captured: tuple[int, ...] = ()
        self.wanted = 0
        self.refused = 0

    def observe(self, size: int) -> None:
        """A micro-batch of ``size`` tokens (patches) ran before capture."""
        self.seen = max(self.seen, int(size))

    def first_rungs(self) -> tuple[int, ...]:
        """The rungs of the first capture: up to the smallest that holds the largest size seen, else all."""
        if not self.seen:
            return self.budgets
        top = next((b for b in self.budgets if b >= self.seen), self.budgets[-1])
        return tuple(b for b in self.budgets if b <= top)

    def source(self) -> str:
        """Why :meth:`first_rungs` chose its top, for the capture summary."""
        if not self.seen:
            return "the whole ladder (no micro-batch seen before capture)"
        return f"the largest micro-batch before capture ({self.seen})"

    @property
    def top(self) -> int:
        """The largest captured rung (0 before any capture)."""
        return self.captured[-1] if self.captured else 0

    def holds(self, budget: int) -> bool:
        """Whether ``budget`` is captured."""
        return budget in self.captured

    def want(self, budget: int) -> None:
        """A micro-batch needed ``budget``, which is not captured (above the top)."""
        if budget > self.top and budget > self.refused:
            self.wanted = max(self.wanted, budget)

    def pending(self) -> tuple[int, ...]:
        """The rungs to capture before the next step: every rung above the top up to the largest wanted."""
        return tuple(b for b in self.budgets if self.top < b <= self.wanted)

    def add(self, rungs: Sequence[int]) -> None:
        """``rungs`` are captured now."""
        self.captured = tuple(sorted(set(self.captured) | {int(b) for b in rungs}))
        if self.wanted <= self.top:
            self.wanted = 0

    def refuse(self) -> None:
        """The pending rungs cannot be captured (memory, or a failed capture): stop asking for them."""
        self.refused = max(self.refused, self.wanted)
        self.wanted = 0

    def reset(self) -> None:
        """Nothing captured (graphs deleted); what was seen stays."""
        self.captured = ()
        self.wanted = 0
        self.refused = 0


class StaticBuffers:
    """The static input buffers the rungs of one graph copy share: each rung's are views of the first rows of one
    buffer, allocated at the largest rung of a capture.

    Safe because one copy replays one rung per micro-batch: a replay writes the inputs of the rung it runs, and no
    other rung's graph reads them before that micro-batch's backward is done (copies hold micro-batches in flight,
    so they never share). A later, larger rung (:class:`BudgetLadder` growth) gets a new buffer; the earlier views
    keep theirs.
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self._device = device

    def view(self, name: str, shape: Sequence[int], dtype: torch.dtype, *, requires_grad: bool = False):
        """A ``shape`` view (the first ``shape[0]`` rows) of the buffer ``name``; a leaf when ``requires_grad``."""
        shape = tuple(int(n) for n in shape)
        buffer = self._buffers.get(name)
        if buffer is None or buffer.dtype != dtype or buffer.shape[1:] != shape[1:] or buffer.size(0) < shape[0]:
            device = self._device if self._device is not None else torch.cuda.current_device()
            buffer = self._buffers[name] = torch.zeros(shape, dtype=dtype, device=device)
        view = buffer[: shape[0]]
        return view.requires_grad_(True) if requires_grad else view

    def nbytes(self) -> int:
        """Bytes of the buffers held now."""
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def clear(self) -> None:
        """Drop the buffers (graphs deleted)."""
        self._buffers.clear()


def free_for_capture() -> int:
    """Bytes a capture may still take on this device: what the driver has free plus what the caching allocator
    holds unused, under the process's cap when one is set (``torch.cuda.set_per_process_memory_fraction``, the
    80 GiB emulation of ``--gpu-memory``)."""
    free, total = torch.cuda.mem_get_info()
    reserved, allocated = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    available = free + reserved - allocated
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if fraction is not None:
        with contextlib.suppress(Exception):
            available = min(available, int(fraction() * total) - allocated)
    return max(0, available)


class LadderHelper:
    """What the budgeted helpers (packed language, vision) share about their ladder: which rungs exist, capturing more
    of them between steps, and the manual hooks that must survive a re-capture.

    A subclass sets ``self.model``, ``self.ladder`` (:class:`BudgetLadder`), ``self.stats``, ``self.copies``,
    ``self.graphs = {}``, ``self._pools = []``, ``self._fused_grad_params = []``, ``self._manual_hooks = False``,
    ``self.on_capture_error``, and provides ``_captured_layers()``, ``_capture_rung(budget, copy, pool)``
    (one copy's graph set of one rung), ``delete_cuda_graphs()`` and ``_set_manual_hooks()``.

    Growing re-captures the whole ladder up to the new top, largest first, into a fresh pool, rather than adding the
    larger rungs to the pool the smaller ones left (``docs/design/shared-pool.md`` says why).
    """

    unit = "tokens"
    sum_param_grads = True
    """Whether the parameter gradients of the captured graphs are summed into ``main_grad`` by graphs of their own
    (:mod:`bridge_cudagraph.capture.param_grads`, where its gate holds); False leaves them to autograd and DDP's
    hooks (the benchmark's lever variant, set before the capture)."""

    def graphs_created(self) -> bool:
        """Whether any graph of the ladder exists."""
        return bool(self.graphs)

    def create_cudagraphs(self) -> None:
        """Capture the ladder's first rungs (:meth:`BudgetLadder.first_rungs`) for every copy, the rungs of a copy
        sharing its memory (:func:`capture_budget_ladder`); on failure, raise or train on eagerly."""
        if self.graphs or not self._captured_layers():
            return
        self.stats.budget_source = self.ladder.source()
        self._capture(self.ladder.first_rungs(), first=True)
        self.copies.reset()

    def _capture(self, rungs: Sequence[int], *, first: bool) -> bool:
        """Capture ``rungs`` into the copies' pools (made at the first capture); whether any graph came of it."""
        if not self._pools:
            self._pools = [torch.cuda.graph_pool_handle() for _ in range(self.copies.count)]
        graphs, fused = capture_budget_ladder(
            stats=self.stats,
            model_chunks=self.model,
            layers=self._captured_layers(),
            budgets=rungs,
            pools=self._pools,
            capture_one=self._capture_rung,
            on_capture_error=self.on_capture_error,
            submodule=self.stats.submodule,
            first=first,
            sum_grads=self.sum_param_grads,
        )
        if not graphs:
            return False
        self.graphs = dict(sorted({**self.graphs, **graphs}.items()))
        self._fused_grad_params = fused
        self.ladder.add(graphs)
        self.stats.budgets_captured = self.ladder.captured
        return True

    def pending_budgets(self) -> tuple[int, ...]:
        """Rungs a micro-batch above the captured top asked for, to capture before the next step."""
        return self.ladder.pending() if self.graphs else ()

    def cuda_graph_set_manual_hooks(self) -> None:
        """Re-create the DDP parameter all-gather pre-hooks that replay bypasses (``overlap_param_gather``); again
        after a re-capture (:meth:`capture_pending`), which deletes them with the graphs."""
        self._set_manual_hooks()
        self._manual_hooks = True

    def capture_pending(self) -> tuple[int, ...]:
        """Re-capture the ladder up to the largest of :meth:`pending_budgets`, where the new pool fits in what is
        free now plus the pool it replaces; else refuse those rungs once (logged), and such micro-batches go on
        running eagerly, counted. Between steps only (the lifecycle calls it before a training step: no micro-batch
        is in flight, the gradients were consumed, and the capture's warmups write into buffers that are zeroed
        after). Returns the rungs that are new."""
        rungs = self.pending_budgets()
        if not rungs:
            return ()
        before, top, new_top = self.ladder.captured, self.ladder.top, rungs[-1]
        pool = sum(self.stats.per_budget.values())
        per_unit = self.stats.per_budget.get(top, 0) / top if top else 0
        need = int(per_unit * new_top * self.copies.count * 1.2)
        available = free_for_capture() + pool
        if need > available:
            self.ladder.refuse()
            logger.warning(
                "bridge_cudagraph: %s budgets %s would need about %.1f GiB of graph memory, %.1f GiB is free with "
                "the graphs they replace; micro-batches above %d %s go on running eagerly (counted)",
                self.stats.submodule,
                list(rungs),
                need / 2**30,
                available / 2**30,
                top,
                self.unit,
            )
            return ()
        hooks = self._manual_hooks
        late = self.stats.late_captures + len(rungs)
        self.delete_cuda_graphs()
        self.stats.per_budget.clear()
        self.stats.per_budget_live.clear()
        self.ladder.observe(new_top)
        self.stats.budget_source = f"{self.ladder.source()}, then a larger one in training ({new_top})"
        if not self._capture(self.ladder.first_rungs(), first=True):
            return ()
        self.copies.reset()
        self.stats.late_captures = late
        if hooks:
            self.cuda_graph_set_manual_hooks()
        return tuple(b for b in self.ladder.captured if b not in before)


def capture_budget_ladder(
    *,
    stats: CaptureStats,
    model_chunks,
    layers,
    budgets,
    pools: Sequence,
    capture_one,
    on_capture_error: str,
    submodule: str,
    first: bool = True,
    sum_grads: bool = True,
) -> tuple[dict, list]:
    """Capture one graph set per budget and copy, as the budgeted helpers (packed language, vision) do; returns
    ``(graphs, fused_params)``: ``{budget: [graph set per copy]}`` and :func:`fused_grad_params` of ``layers``.

    One pool per copy (``pools``, kept by the helper so that a later rung goes into the same one), its budgets
    captured into it largest first; ``capture_one(budget, copy, pool)`` captures copy ``copy``'s set of ``budget``.
    The contract that makes the rungs of a copy share one pool safely: within a copy one micro-batch replays one rung,
    forward then backward, before any other rung of that copy runs; copies never share a pool. Every capture keeps
    TE's clone of the returned parameter gradients (``clone_param_grads_on_return``, its default) unless a summing
    graph reads them on their own stream. Why each of these holds, and what breaks without it:
    ``docs/design/shared-pool.md`` and ``docs/design/param-grads.md``.

    ``sum_grads``: each copy's parameter gradients summed by graphs of their own once its rungs are captured
    (:func:`~bridge_cudagraph.capture.param_grads.sum_param_grads`).

    ``first``: the run's first capture. On failure: re-raised with ``on_capture_error="raise"``; else a first capture
    leaves the model eager (:func:`abandon_capture`, the cause in ``stats.failed``), a later one (a ladder growing)
    keeps the graphs it has; ``({}, [])`` comes back either way.
    """
    try:
        with measure(stats, add=not first), megatron_capturing():
            stats.param_grads_cloned = True
            captured = {}
            for budget in sorted(budgets, reverse=True):
                # TE's warmups cache blocks on their own streams; count the pool alone.
                before, live = held_reserved(), torch.cuda.memory_allocated()
                captured[budget] = [capture_one(budget, copy, pool) for copy, pool in enumerate(pools)]
                gc.collect()
                stats.per_budget[budget] = held_reserved() - before
                stats.per_budget_live[budget] = torch.cuda.memory_allocated() - live
            fused = fused_grad_params(layers)
            if sum_grads and captured:
                summed = [
                    sum_param_grads([sets[copy] for sets in captured.values()], layers, model_chunks, fused)
                    for copy in range(len(pools))
                ]
                stats.param_grads_summed = summed[0]
                if summed[0]:
                    stats.param_grads_cloned = False
            zero_grad_buffers(model_chunks)
            gc.collect()
    except Exception as error:
        if on_capture_error == "raise":
            raise
        if first:
            stats.failed = abandon_capture(layers, model_chunks, error, submodule)
        else:
            from bridge_cudagraph.host.compat import set_graph_capturing

            set_graph_capturing(False)
            zero_grad_buffers(model_chunks)
            cause = f"{type(error).__name__}: {error}".splitlines()[0][:500]
            logger.warning(
                "bridge_cudagraph: capturing more %s budgets failed; they run eagerly: %s", submodule, cause
            )
        return {}, []
    graphs = dict(sorted(captured.items()))
    stats.graphs += sum(len(g.layers) for sets in graphs.values() for g in sets)
    return graphs, fused
