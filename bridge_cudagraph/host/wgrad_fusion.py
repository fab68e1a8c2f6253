"""``model.gradient_accumulation_fusion=true`` honoured where APEX is absent: Transformer Engine's layers fuse.

Host change:
  changes: ``fuse_wgrad_accumulation`` of the TE modules the provider's ``provide()`` built from its own config; the
    provider's ``gradient_accumulation_fusion`` off for the length of the host's ``provide()``
  written for: megatron-core 0.19.2 ``extensions/transformer_engine.py``, Bridge 0.6.2 ``utils/fusions.py``
  gate: the proven stack (:func:`~bridge_cudagraph.host.compat.check_proven_stack`);
    ``model.gradient_accumulation_fusion`` on a provider of this package
  undo: the setting comes back when ``provide()`` returns (:func:`unfused_build`); the modules are built so

Why: with the fusion a TE layer's weight-gradient GEMM accumulates straight into the parameter's fp32
``main_grad`` (``accumulate=True``, ``out=main_grad``). Without it every TE weight gets a bf16 gradient per
micro-batch and Megatron's DDP hook adds it to ``main_grad`` in a separate kernel. At the 2B Qwen3-VL shape on an
H200 the step makes 541 such additions (10 ms of GPU time); the fusion removes the language model's 112 (kernel
time 3 ms lower, the step 1.015-1.022x faster side by side; results/padded-levers/ has the runs). The vision
encoder's and the non-TE parameters' additions stay.

Bridge 0.6.2 turns the setting on whenever TE imports (``utils/fusions.py``,
``can_enable_gradient_accumulation_fusion``: "TE handles fuse_wgrad_accumulation internally"), but megatron-core's own
``ColumnParallelLinear``, the language model's output layer, needs APEX's ``fused_weight_gradient_mlp_cuda`` and raises
at construction without it (:func:`bridge_cudagraph.host.compat.apex_gradient_accumulation_fusion_available`). On a
stack without APEX (the PyPI wheels) a Bridge recipe therefore either fails to build or must switch the fusion off for
every layer.

A provider of this plugin builds such a model with the setting off for the duration of the host's ``provide()``
(:func:`unfused_build`: megatron-core's own linears build unfused, as without the setting), then turns TE's fusion on
in exactly the TE modules built from the provider's own config (:func:`fuse_te_modules`): the modules whose
construction reads ``config.gradient_accumulation_fusion`` (megatron-core's ``TELinear``,
``TELayerNormColumnParallelLinear``, ``TEGroupedLinear``, ``extensions/transformer_engine.py``). TE reads the
attribute at every forward. The vision encoder's TE layers keep their own config's setting (Bridge's
``get_vision_model_config`` leaves it off), as on a stack with APEX. The provider's field keeps the value the recipe
set.

Graphs: TE marks each fused weight ``grad_added_to_main_grad`` in its Python, so DDP's hook skips the placeholder
gradient TE returns; a replay runs no Python, which megatron-core's ``zero_grad_buffer`` allows for under
language graphs (it keeps the mark when ``cuda_graph_impl == "transformer_engine"``) and the vision helper restores
before each replay (:meth:`bridge_cudagraph.capture.vision.VisionGraphHelper.before_replay`). TE's warmup passes
write into ``main_grad``, which every capture zeroes afterwards
(:func:`bridge_cudagraph.capture.grad_buffers.zero_grad_buffers`).
Eagerly, TE overwrites ``main_grad`` at a step's first micro-batch (``is_first_microbatch``) and accumulates after;
a graph captured after the warmup always accumulates, into the buffer DDP zeroed: the same numbers, since adding
to zero is exact. Graphs on and off fuse alike, so they train the same numbers; the fused sum rounds once per
micro-batch in fp32 instead of through a bf16 gradient, so a run with the fusion differs (slightly, in the gradients'
last bits) from one without.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def fuses_te_layers_only(provider: Any) -> bool:
    """Whether ``provider`` asks for the fusion on a stack that can only give it to TE's layers (no APEX)."""
    from bridge_cudagraph.host.compat import apex_gradient_accumulation_fusion_available

    return bool(getattr(provider, "gradient_accumulation_fusion", False)) and not (
        apex_gradient_accumulation_fusion_available()
    )


@contextlib.contextmanager
def unfused_build(provider: Any) -> Iterator[bool]:
    """Around the host's ``provide()``: the setting off while the model is built, when only TE can fuse; yields
    whether it did so. The provider's field is restored on the way out, also when the build raises."""
    if not fuses_te_layers_only(provider):
        yield False
        return
    provider.gradient_accumulation_fusion = False
    try:
        yield True
    finally:
        provider.gradient_accumulation_fusion = True


def fuse_te_modules(model: Any, config: Any) -> int:
    """Turn TE's weight-gradient fusion on in the TE modules of ``model`` built from ``config``; how many there are.

    Module identity, not type, picks them: megatron-core's TE wrappers keep the config they were built from
    (``self.config``), and only those built from this config would have read its ``gradient_accumulation_fusion``.
    """
    from transformer_engine.pytorch.module.base import TransformerEngineBaseModule

    fused = 0
    for module in model.modules():
        if isinstance(module, TransformerEngineBaseModule) and getattr(module, "config", None) is config:
            if hasattr(module, "fuse_wgrad_accumulation"):
                module.fuse_wgrad_accumulation = True
                fused += 1
    return fused


def te_modules_fusing(model: Any) -> int:
    """How many TE modules of ``model`` accumulate their weight gradient into ``main_grad`` themselves."""
    from transformer_engine.pytorch.module.base import TransformerEngineBaseModule

    return sum(
        1
        for m in model.modules()
        if isinstance(m, TransformerEngineBaseModule) and getattr(m, "fuse_wgrad_accumulation", False)
    )
