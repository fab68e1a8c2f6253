"""Run-level checks: settings outside the model provider that make static-shape graphs impossible or unsafe.

The provider's own ``finalize()`` (:mod:`bridge_cudagraph.mixin`) checks the model; this looks at the rest of a
Bridge ``ConfigContainer`` (data loading, packing, environment) before any process group or GPU work, so a bad
run fails at config time with the setting and the fix, not with a shape error from TE at step N.
"""

from __future__ import annotations

import os
from typing import Any

from bridge_cudagraph.config import CudaGraphConfigError


def check_environment(environ: dict[str, str] | None = None) -> None:
    """``expandable_segments:True`` makes NCCL's graph registration read freed memory unless it is disabled
    (megatron-core asserts this only when the helper is built, i.e. at the capture step)."""
    env = os.environ if environ is None else environ
    if "expandable_segments:True" in env.get("PYTORCH_CUDA_ALLOC_CONF", "") and env.get("NCCL_GRAPH_REGISTER") != "0":
        raise CudaGraphConfigError(
            "PYTORCH_CUDA_ALLOC_CONF has expandable_segments:True, which with CUDA graphs needs NCCL_GRAPH_REGISTER=0 "
            "(else illegal memory accesses); export NCCL_GRAPH_REGISTER=0 or drop expandable_segments"
        )


def check_run(config: Any) -> None:
    """Check a Bridge ``ConfigContainer`` whose model carries a ``cuda_graph`` block with graphs on."""
    model = config.model
    cg = getattr(model, "cuda_graph", None)
    if cg is None or not cg.any_enabled:
        return
    check_environment()
    train, dataset = getattr(config, "train", None), getattr(config, "dataset", None)
    if cg.language.enabled:
        loader = getattr(dataset, "dataloader_type", None) or getattr(train, "dataloader_type", None)
        if loader == "batch":
            raise CudaGraphConfigError(
                "dataset.dataloader_type='batch' gives every step its own sequence length, but language graphs have "
                "one static length; use dataloader_type 'single' or 'cyclic' with padding to model.seq_length"
            )
        for name in ("enable_in_batch_packing", "defer_in_batch_packing_to_step"):
            if getattr(dataset, name, False):
                raise CudaGraphConfigError(
                    f"dataset.{name}=true packs variable-length sequences, which language graphs cannot replay "
                    "(megatron-core asserts packed_seq_params is None at replay); set it to false and "
                    "dataset.pad_to_max_length=true, or set model.cuda_graph.language.enabled=false"
                )
        if getattr(dataset, "pad_to_max_length", True) is False:
            raise CudaGraphConfigError(
                "dataset.pad_to_max_length=false lets sequence lengths vary per batch; language graphs need every "
                "micro-batch at model.seq_length: set dataset.pad_to_max_length=true"
            )
        seq = getattr(dataset, "seq_length", None) or getattr(dataset, "sequence_length", None)
        if seq is not None and seq != model.seq_length:
            raise CudaGraphConfigError(
                f"dataset sequence length {seq} != model.seq_length {model.seq_length}: the graphs are captured at "
                "model.seq_length; make them equal"
            )


def check_can_train_with_graphs(config: Any) -> None:
    """``train`` with graphs needs a CUDA device; say so before any import of the heavy stack."""
    import torch

    cg = getattr(config.model, "cuda_graph", None)
    if cg is not None and cg.any_enabled and not torch.cuda.is_available():
        raise CudaGraphConfigError(
            "model.cuda_graph asks for CUDA graphs but this machine has no CUDA device; run on a GPU machine, or use "
            "`bridge-cudagraph plan` / `validate` here"
        )
