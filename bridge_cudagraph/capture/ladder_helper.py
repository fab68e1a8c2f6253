"""The base of the budgeted helpers (packed and padded language, vision): their ladder's first capture, its growth
between steps, and the manual hooks that must survive a re-capture."""

from __future__ import annotations

import gc
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from bridge_cudagraph.capture.device_memory import free_for_capture
from bridge_cudagraph.capture.graph_copies import reset_graph_sets
from bridge_cudagraph.capture.ladder_capture import capture_budget_ladder

if TYPE_CHECKING:
    from bridge_cudagraph.capture.budget_ladder import BudgetLadder
    from bridge_cudagraph.capture.graph_copies import GraphCopies
    from bridge_cudagraph.capture.static_inputs import StaticBuffers
    from bridge_cudagraph.capture.stats import CaptureStats

logger = logging.getLogger("bridge_cudagraph")

__all__ = ["LadderHelper"]

GROWTH_MARGIN = 1.2
"""The factor on a grown ladder's estimated pool before :meth:`LadderHelper.capture_pending` re-captures it. The
estimate scales the captured top rung's measured pool linearly to the new top; the lower rungs share that pool and
keep alive only their outputs beyond it, and the allocator rounds segments up. Neither is estimated, so the 20% is a
margin chosen, not measured: too small, and a re-capture that does not fit fails as any capture does (its
``on_capture_error``); too large, and a rung that would fit is refused (logged)."""


class LadderHelper:
    """What the budgeted helpers (packed language, vision) share about their ladder: which rungs exist, capturing more
    of them between steps, and the manual hooks that must survive a re-capture.

    A subclass sets ``self.model``, ``self.ladder``
    (:class:`~bridge_cudagraph.capture.budget_ladder.BudgetLadder`), ``self.stats``, ``self.copies``,
    ``self.graphs = {}``, ``self._pools = []``, ``self._fused_grad_params = []``, ``self._manual_hooks = False``,
    ``self.on_capture_error``, ``self._statics`` (the static buffers of each copy), and provides
    ``_captured_layers()``, ``_hooked_layers()`` (every layer whose manual hooks the replay runs),
    ``_capture_rung(budget, copy, pool)`` (one copy's graph set of one rung) and ``_set_manual_hooks()``.

    Growing re-captures the whole ladder up to the new top, largest first, into a fresh pool, rather than adding the
    larger rungs to the pool the smaller ones left (``docs/design/shared-pool.md`` says why).
    """

    unit = "tokens"
    sum_param_grads = True
    """Whether the parameter gradients of the captured graphs are summed into ``main_grad`` by graphs of their own
    (:mod:`bridge_cudagraph.capture.param_grads`, where its gate holds); False leaves them to autograd and DDP's
    hooks (the benchmark's lever variant, set before the capture)."""

    if TYPE_CHECKING:  # what a subclass sets and provides (the class docstring); declared for the type checker only
        model: list[torch.nn.Module]
        ladder: BudgetLadder
        stats: CaptureStats
        copies: GraphCopies
        graphs: dict[int, list]
        _pools: list
        _fused_grad_params: list[torch.nn.Parameter]
        _manual_hooks: bool
        on_capture_error: str
        _statics: list[StaticBuffers]

        def _captured_layers(self) -> list: ...
        def _hooked_layers(self) -> list: ...
        def _capture_rung(self, budget: int, copy: int, pool: Any) -> Any: ...
        def _set_manual_hooks(self) -> None: ...

    def graphs_created(self) -> bool:
        """Whether any graph of the ladder exists."""
        return bool(self.graphs)

    def create_cudagraphs(self) -> None:
        """Capture the ladder's first rungs
        (:meth:`~bridge_cudagraph.capture.budget_ladder.BudgetLadder.first_rungs`) for every copy, the rungs of a copy
        sharing its memory (:func:`~bridge_cudagraph.capture.ladder_capture.capture_budget_ladder`); on failure, raise
        or train on eagerly."""
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

    def delete_cuda_graphs(self) -> None:
        """Free every graph (TE ``reset()``) before process groups go away; allows re-capture."""
        reset_graph_sets(self.graphs)
        self.graphs = {}
        self._pools = []
        for statics in self._statics:
            statics.clear()
        self.ladder.reset()
        self.copies.reset()
        self._fused_grad_params = []
        for layer in self._hooked_layers():
            layer.cuda_graph_manual_hooks = []
        self.stats.graphs = 0
        gc.collect()

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
        need = int(per_unit * new_top * self.copies.count * GROWTH_MARGIN)
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
