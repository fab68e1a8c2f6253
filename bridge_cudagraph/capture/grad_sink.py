"""A graph's parameter gradients summed into ``main_grad`` once per graph, not once per parameter
(``model.cuda_graph.param_grads_per_graph``).

A TE graphed callable takes its module's parameters as inputs of its autograd function, so every backward replay
hands each parameter's gradient to that parameter's ``AccumulateGrad`` node, and megatron-core's DDP hook on that node
(``DistributedDataParallel._make_backward_post_hook``) adds it to ``main_grad`` (one kernel launch; skipped where TE
already accumulated in its GEMM) and, with ``overlap_grad_reduce``, tells the bucket the gradient is ready. At the
Qwen3-VL-2B shape that is 541 nodes and Python hooks per micro-batch, the largest CPU op in the vision backward, where
the GPU idles most (issue #18, run 48).

:class:`GradSink` wraps one graphed callable. Its forward runs the graph inside an autograd function whose inputs are
the call's tensors only, so autograd builds no ``AccumulateGrad`` node and runs no DDP hook for the parameters. Its
backward replays the graph's backward through ``torch.autograd.grad`` (TE's own ``GraphedBackward``: the same replay,
the parameter gradients in the graph's static buffers), adds those TE did not add itself to ``main_grad`` in one
multi-tensor call (the same fp32 additions, each ``main_grad`` once per micro-batch, as the hook's ``add_``), then
registers each parameter ready with its bucket group as the hook does (megatron-core 0.19.2; other releases keep the
per-parameter path, :func:`~bridge_cudagraph.compat.ddp_grad_hook_is_mirrored`).

Only where megatron-core's DDP owns every parameter of the graphs (:func:`~bridge_cudagraph.capture.common.
ddp_consumes_param_grads`); any other owner keeps the per-parameter path.

Measured at the 2B shape on an H200 (run 50): 512 of the 541 ``AccumulateGrad`` nodes gone, but the step paired
against the per-parameter path is 1.005x (95% CI 0.983-1.021). The nested ``torch.autograd.grad`` costs the host
about what the nodes and hooks did (45 ms of profiled CPU per step for 8 graphs, where TE's ``GraphedBackward``
alone takes 21), and ``_foreach_add_`` of fp32 ``main_grad`` with bf16 gradients runs per tensor. Hence opt-in.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

logger = logging.getLogger("bridge_cudagraph")

__all__ = ["GradSink", "ddp_owners", "sink_graphs"]


class _ThroughGraph(torch.autograd.Function):
    """The graph's replay as an autograd function of the call's tensors only (see the module docstring)."""

    @staticmethod
    def forward(ctx, sink: GradSink, spec, others: tuple, *tensors: torch.Tensor):
        inner = tuple(t.detach().requires_grad_(t.requires_grad) for t in tensors)
        leaves, taken = [], iter(inner)
        for leaf in others:
            leaves.append(next(taken) if leaf is _TENSOR else leaf)
        args, kwargs = tree_unflatten(leaves, spec)
        with torch.enable_grad():
            out = sink.graph(*args, **kwargs)
        flat, sink.out_spec = tree_flatten(out)
        ctx.sink, ctx.inner, ctx.outs = sink, inner, flat
        return tuple(o.detach() for o in flat)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        sink, inner, outs = ctx.sink, ctx.inner, ctx.outs
        pairs = [(o, g) for o, g in zip(outs, grads, strict=True) if o.requires_grad]
        wanted = [t for t in inner if t.requires_grad]
        if not pairs:  # no output depends on anything that needs a gradient
            return (None, None, None, *(None for _ in inner))
        got = torch.autograd.grad(
            [o for o, _ in pairs], wanted + sink.params, [g for _, g in pairs], allow_unused=True
        )
        sink.accumulate(got[len(wanted) :])
        input_grads = iter(got[: len(wanted)])
        ctx.inner = ctx.outs = None
        return (None, None, None, *(next(input_grads) if t.requires_grad else None for t in inner))


class _Tensor:
    """Marks where a tensor was among a call's flattened arguments."""


_TENSOR = _Tensor()


class GradSink:
    """One graphed callable whose parameters' gradients go to ``main_grad`` once per backward replay.

    Args:
        graph: The TE graphed callable (what ``make_graphed_callables`` returned for one callable).
        params: The trainable parameters its module captured.
        owners: ``{parameter: (bucket group, force_all_reduce)}`` from the DDP chunks owning them
            (:func:`ddp_owners`), for the readiness registration under ``overlap_grad_reduce``; None without it.
    """

    def __init__(self, graph, params: Sequence[torch.nn.Parameter], owners: dict | None) -> None:
        self.graph = graph
        self.params = [p for p in params if p.requires_grad]
        self.owners = owners
        self.out_spec = None

    def __call__(self, *args, **kwargs):
        leaves, spec = tree_flatten((args, kwargs))
        tensors = tuple(leaf for leaf in leaves if isinstance(leaf, torch.Tensor))
        others = tuple(_TENSOR if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves)
        flat = _ThroughGraph.apply(self, spec, others, *tensors)
        return tree_unflatten(list(flat), self.out_spec)

    def accumulate(self, grads: Sequence[torch.Tensor | None]) -> None:
        """What DDP's hook does for each parameter (megatron-core 0.19.2 ``_make_backward_post_hook``): add the
        gradient to ``main_grad`` unless TE did in its GEMM (``grad_added_to_main_grad``, unless ``zero_out_wgrad``),
        then, with ``overlap_grad_reduce``, register the parameter ready; one multi-tensor add for all of them."""
        mains, adds = [], []
        for param, grad in zip(self.params, grads, strict=True):
            if grad is None:
                continue
            if not getattr(param, "grad_added_to_main_grad", False) or getattr(param, "zero_out_wgrad", False):
                mains.append(param.main_grad)
                adds.append(grad)
        if mains:
            torch._foreach_add_(mains, adds)
        if self.owners is not None:
            for param, grad in zip(self.params, grads, strict=True):
                if grad is not None:
                    group, force = self.owners[param]
                    group.register_grad_ready(param, force)

    def reset(self) -> None:
        """Free the graph (what megatron-core's and this plugin's teardown call on a graphed callable)."""
        self.graph.reset()


def ddp_owners(model_chunks) -> dict | None:
    """``{parameter: (bucket group, force_all_reduce)}`` over ``model_chunks`` (megatron-core DDP chunks), or None
    when no chunk overlaps its gradient reduction (then nothing is registered ready: DDP reduces in its finish)."""
    owners: dict = {}
    overlap = False
    for chunk in model_chunks:
        overlap = overlap or bool(chunk.ddp_config.overlap_grad_reduce)
        force = bool(getattr(chunk, "force_all_reduce", False))
        for param, group in chunk.param_to_bucket_group.items():
            owners[param] = (group, force)
    return owners if overlap else None


@functools.cache
def _warn_not_mirrored() -> None:
    """Once per process: the budgeted helpers ask once per budget and copy."""
    logger.warning(
        "bridge_cudagraph: model.cuda_graph.param_grads_per_graph is on, but this megatron-core is not the "
        "release whose DDP gradient hook it mirrors; the parameters keep megatron-core's per-parameter path"
    )


def sink_graphs(graphs: list, params: Sequence[Sequence[torch.nn.Parameter]], model_chunks) -> list:
    """``graphs[i]`` wrapped in a :class:`GradSink` for ``params[i]``, where the host allows it; else unchanged."""
    from bridge_cudagraph.compat import ddp_grad_hook_is_mirrored

    if not ddp_grad_hook_is_mirrored():
        _warn_not_mirrored()
        return list(graphs)
    owners = ddp_owners(model_chunks)
    return [GradSink(graph, unit, owners) for graph, unit in zip(graphs, params, strict=True)]
