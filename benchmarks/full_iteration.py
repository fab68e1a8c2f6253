"""Upstream's strongest option as the benchmark's anchor: megatron-core 0.19.2's full-iteration graph
(``cuda_graph_impl="full_iteration"``, ``megatron/core/full_cuda_graph.py``), run by :mod:`benchmarks.bench` as the
variant ``upstream_full_iteration``.

What megatron-core's ``FullCudaGraphWrapper`` captures, read in 0.19.2 and in how Megatron-Bridge 0.6.2's
``train()`` installs it (``train.py:315``: around the function ``get_forward_backward_func`` returns, with
``cuda_graph_warmup_steps`` and ``cuda_graph_use_single_mempool`` from the model config):

* one CUDA graph of one whole call of the schedule: every micro-batch's forward and backward, and the gradient
  finalisation the schedule calls at its end (``finalize_model_grads``: DDP's reduction). The optimizer step,
  ``zero_grad_buffer`` and the loss's trip to the host stay outside it;
* the data: at every call (eager ones too) it draws ``num_microbatches`` batches from the iterator on the host and
  copies each into a static buffer per micro-batch index (``StaticBufferLoader``, a dict of tensors, kept on the
  class). The first call clones; later calls ``copy_`` into those tensors, so every step's micro-batch ``j`` must
  have the first step's keys, shapes and dtypes (a smaller tensor that broadcasts is copied without an error), and
  anything that is not a tensor (an int, a ``PackedSeqParams``) is handed over as it is but the graph replays the
  values it was captured with. Packed rows therefore need static ``cu_seqlens`` (Bridge:
  ``offline_packing_specs.pad_cu_seqlens=True`` with ``pad_to_max_length``, which its config validation demands for
  full-iteration graphs) and must reach the forward step as tensors;
* the call counter, graph and result live on the class: one full-iteration graph per process and stage, which is
  why :class:`FullIterationStep` refuses to start while another is alive and clears them when it closes;
* at the capture: ``torch.distributed.barrier()`` before and after, every RNG state of megatron's tracker
  registered with the graph, ``torch.autograd.graph.set_override_stale_capture_stream(True)`` (a process-wide
  switch it never turns back: restored here), and ``capture_error_mode="thread_local"``: any host read of a device
  value inside the forward or backward (``.item()``, ``.tolist()``, a boolean-mask index) fails the capture.

Bridge's config validation adds ``rerun_state_machine.check_for_nan_in_loss=False`` (Megatron-LM:
``--no-check-for-nan-in-loss-and-grad``); the benchmark's harness has no rerun state machine and its DDP checks no
NaN in gradients (``examples.tiny.ddp_config``), so both hold. ``empty_unused_memory_level`` only empties the cache
outside the graph. megatron-core's own ``TransformerConfig`` asserts ``cuda_graph_modules`` empty and switches TE's
cross entropy to its capturable form under ``full_iteration``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.schema import FULL_ITERATION

#: Values a static buffer may carry from step to step when they are equal (the graph replays the captured one).
_PLAIN = (type(None), bool, int, float, str)
#: The schedule's stage whose graph the benchmark captures.
_STAGE = "training"


class VariantRefused(RuntimeError):
    """A variant that cannot run on a configuration's data as the benchmark feeds it (recorded ``"refused"`` with
    this message, never timed)."""


def capture_call(warmup_steps: int) -> int:
    """The step a graph that Bridge captures after its warmup is captured at in the benchmark: the last eager warmup
    step (at least the second), so the capture stays out of the timed steps and follows an eager step of the same
    state (the optimizer graph's rule, which the full-iteration graph shares)."""
    return max(1, warmup_steps - 1)


def _describe(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"{getattr(value, 'dtype', '?')} {list(shape)}"
    return type(value).__name__ if not isinstance(value, _PLAIN) else repr(value)


def static_input_mismatch(steps: Sequence[Sequence[Mapping[str, Any]]]) -> str | None:
    """Why megatron-core's static buffers cannot carry ``steps`` (each step's micro-batches, dicts of model inputs),
    or None when they can: every step must have the first step's number of micro-batches, and micro-batch ``j`` the
    first step's keys, tensors of the same shape and dtype, and equal plain values (None, numbers, strings). Any
    other object (a ``PackedSeqParams``) is refused: ``StaticBufferLoader`` hands it on as it is, and the graph
    would replay the tensors of the one it was captured with."""
    if not steps:
        return None
    first = steps[0]
    for i, step in enumerate(steps):
        if len(step) != len(first):
            return f"step {i} has {len(step)} micro-batches where step 0 has {len(first)}"
        for j, (batch, static) in enumerate(zip(step, first, strict=True)):
            where = f"micro-batch {j} of step {i}"
            if set(batch) != set(static):
                return f"{where} has keys {sorted(batch)} where step 0's has {sorted(static)}"
            for key, value in batch.items():
                ref = static[key]
                tensor, ref_tensor = hasattr(value, "shape"), hasattr(ref, "shape")
                if tensor and ref_tensor:
                    if tuple(value.shape) != tuple(ref.shape) or value.dtype != ref.dtype:
                        return f"{where}: {key} is {_describe(value)} where the static buffer holds {_describe(ref)}"
                    continue
                if tensor != ref_tensor or not isinstance(value, _PLAIN):
                    return (
                        f"{where}: {key} is {_describe(value)} (step 0: {_describe(ref)}), which the static buffers "
                        "do not copy: the graph would replay the captured value"
                    )
                if value != ref:
                    return f"{where}: {key} is {value!r} where step 0's is {ref!r}: the graph replays step 0's"
    return None


def static_plan(plan: Sequence[Sequence[int]]) -> list[list[int]]:
    """``plan`` with every step given the first step's micro-batches: the data the static buffers can carry, for
    the probe that says what the wrapper does with the model once the shapes are static."""
    return [list(plan[0]) for _ in plan] if plan else []


def error_origin(error: BaseException) -> dict[str, str]:
    """Where ``error`` came from: its root cause (the last of the ``__cause__``/``__context__`` chain: a capture that
    fails inside ``torch.cuda.graph`` surfaces as the capture's end failing, with the host read that invalidated it
    as the context) as ``cause`` (type and first line), and ``where``, the innermost frame of that cause's traceback
    (``file:line in function``, the path from ``site-packages/`` or the working directory on)."""
    root, seen = error, {id(error)}
    while True:
        nxt = root.__cause__ or root.__context__
        if nxt is None or id(nxt) in seen:
            break
        seen.add(id(nxt))
        root = nxt
    lines = str(root).strip().splitlines()
    out = {"cause": f"{type(root).__name__}: {lines[0] if lines else ''}"[:300]}
    frames = traceback.extract_tb(root.__traceback__)
    if frames:
        frame = frames[-1]
        path = frame.filename
        if "site-packages/" in path:
            path = path.split("site-packages/")[-1]
        else:
            with contextlib.suppress(ValueError):
                path = os.path.relpath(path)
        out["where"] = f"{path}:{frame.lineno} in {frame.name}"
    return out


def _override_stale_capture_stream() -> bool | None:
    """torch's process-wide switch that the wrapper turns on at its capture (None where torch has no getter)."""
    import torch

    getter = getattr(torch._C, "_override_stale_capture_stream", None)
    return None if getter is None else bool(getter())


class FullIterationStep:
    """megatron-core's ``FullCudaGraphWrapper`` around the schedule's function, as Megatron-Bridge 0.6.2's ``train()``
    builds it, for :func:`bridge_cudagraph.testing.parity.train_steps`' ``forward_backward_func``: eager for
    ``capture_at`` calls, captured (and replayed) at that call, replayed after. The capture call is measured like
    every other capture of the benchmark (:func:`bridge_cudagraph.capture.device_memory.measure`: wall time, growth of
    reserved memory; it includes the wrapper's one replay after the capture).

    The wrapper keeps its graph, result, call count and static buffers on its classes; they are cleared here on
    entry (none may be alive) and by :meth:`close` (megatron-core's own ``reset_cuda_graph``, then the buffers it
    leaves), which also turns torch's stale-capture-stream switch back to what it was."""

    def __init__(self, pp_size: int, capture_at: int, *, use_single_mempool: bool = False) -> None:
        from megatron.core.full_cuda_graph import FullCudaGraphWrapper, StaticBufferLoader
        from megatron.core.pipeline_parallel.schedules import get_forward_backward_func

        from bridge_cudagraph.capture.stats import CaptureStats

        if any(graph is not None for graph in FullCudaGraphWrapper.cuda_graph.values()):
            raise RuntimeError("another full-iteration graph is alive in this process (megatron-core keeps one)")
        self._stale_stream = _override_stale_capture_stream()
        self.capture_at = capture_at
        self.stats = CaptureStats(FULL_ITERATION)
        self.wrapper = FullCudaGraphWrapper(
            get_forward_backward_func(pp_size=pp_size),
            cuda_graph_warmup_steps=capture_at,
            use_single_mempool=use_single_mempool,
        )
        self.wrapper.reset_cuda_graph()
        for buffers in StaticBufferLoader.static_buffers.values():
            buffers.clear()

    def captured(self) -> bool:
        """Whether the training graph exists."""
        from megatron.core.full_cuda_graph import FullCudaGraphWrapper

        return FullCudaGraphWrapper.cuda_graph[_STAGE] is not None

    def __call__(self, **kwargs: Any) -> Any:
        if self.wrapper.curr_iter(_STAGE) != self.capture_at:
            return self.wrapper(**kwargs)
        from bridge_cudagraph.capture.device_memory import measure

        with measure(self.stats):
            out = self.wrapper(**kwargs)
        self.stats.graphs = int(self.captured())
        return out

    def capture_record(self) -> dict[str, Any]:
        """The variant record's capture fields (as ``bench._capture`` gives the other graphed variants); raises when
        the capture call has not produced a graph."""
        if not self.captured():
            raise RuntimeError(f"{FULL_ITERATION}: no graph after {self.wrapper.curr_iter(_STAGE)} calls")
        return {"capture_s": self.stats.seconds, "graph_memory_bytes": self.stats.graph_memory_bytes}

    def close(self) -> None:
        """Drop the graph, its result and the static buffers, and restore torch's stale-capture-stream switch."""
        import torch
        from megatron.core.full_cuda_graph import StaticBufferLoader

        self.wrapper.reset_cuda_graph()
        for buffers in StaticBufferLoader.static_buffers.values():
            buffers.clear()
        if self._stale_stream is not None:
            torch.autograd.graph.set_override_stale_capture_stream(self._stale_stream)


def probe_shared(shared: Any) -> Any:
    """``shared`` (bench's per-configuration state) with :func:`static_plan` as its plan, the first step's model
    FLOPs for every step, and no reference run: the probe is timed only (its batches are not eager's)."""
    flops = list(shared.flops_per_step[:1]) * len(shared.plan)
    return dataclasses.replace(
        shared, plan=static_plan(shared.plan), flops_per_step=flops, eager={}, eager_losses=None
    )
