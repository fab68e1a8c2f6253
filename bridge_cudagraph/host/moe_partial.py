"""What the packed MoE graphs (:mod:`bridge_cudagraph.capture.packed_moe`) need of megatron-core's transformer layer,
MoE layer and token dispatcher: a graph that holds a layer's attention, router and dispatch preprocess (megatron-core's
partial scope ``[attn, moe_router, moe_preprocess]``), and the eager remainder after it, as
``TransformerLayer._te_cuda_graph_replay_impl`` runs it in its ``moe_router`` branch; read and set here only.

Host change:
  changes: an MoE layer's ``cudagraph_tensor_store`` (set from a graph's outputs before the layer's eager remainder,
    cleared after it) and its token dispatcher's attributes: the tensors named in ``valid_cudagraph_attrs`` (from the
    graph's outputs, as megatron-core's replay sets them) and the non-tensor values among ``cudagraph_attrs`` plus
    ``hidden_shape_before_permute`` (shapes and counts), put back as the capture of the same rung left them
    (:func:`dispatcher_shapes`, :func:`resume`): megatron-core's replay never needs that, since its graphs have one
    shape, while a rung of the ladder has its own
  written for: megatron-core 0.19.2 ``transformer/transformer_layer.py`` (``_forward_attention``, ``_forward_mlp``,
    ``_forward_post_mlp``, ``_te_cuda_graph_replay_impl``), ``transformer/moe/moe_utils.py``
    (``MoECudaGraphPartialCaptureSignal``, ``maybe_skip_or_early_return_by_cudagraph``, ``MoECudaGraphTensorStore``),
    ``transformer/moe/token_dispatcher.py`` (``MoEAlltoAllTokenDispatcher.cudagraph_attrs``, ``dispatch_preprocess``)
  gate: the proven stack (:func:`~bridge_cudagraph.host.compat.moe_partial_capture_is_mirrored`); the layer's config
    holds ``moe_router`` and ``moe_preprocess`` in ``cuda_graph_modules`` (:func:`partial_scope`)
  undo: ``cudagraph_tensor_store.clear()`` after each remainder (in a ``finally``); the dispatcher's attributes are
    written again by its next preprocess, eager or graphed

Not run on a GPU yet: megatron-core's MoE router and dispatcher need CUDA, so nothing here has run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "attention",
    "check_partial_scope",
    "dispatcher_shapes",
    "is_moe_layer",
    "mlp_head",
    "partial_scope",
    "resume",
]

#: A dispatcher attribute that ``dispatch_preprocess`` sets from the input's shape but does not list in
#: ``cudagraph_attrs`` (megatron-core 0.19.2 ``MoEAlltoAllTokenDispatcher``); its combine reads it.
SHAPE_ATTRIBUTES = ("hidden_shape_before_permute",)


def is_moe_layer(layer: Any) -> bool:
    """Whether a decoder layer's MLP is megatron-core's ``MoELayer`` (``TransformerLayer.is_moe_layer``)."""
    return bool(getattr(layer, "is_moe_layer", False))


def partial_scope(config: Any) -> bool:
    """Whether ``config.cuda_graph_modules`` holds ``moe_router`` and ``moe_preprocess``: the scope under which an
    MoE layer's forward returns after its dispatch preprocess while a graph captures it
    (``maybe_skip_or_early_return_by_cudagraph``), and ``TransformerLayer._forward_mlp`` returns the graph's
    outputs."""
    from megatron.core.transformer.enums import CudaGraphModule

    modules = list(getattr(config, "cuda_graph_modules", None) or [])
    return CudaGraphModule.moe_router in modules and CudaGraphModule.moe_preprocess in modules


def check_partial_scope(layer: Any) -> str | None:
    """Why ``layer`` cannot be captured in the partial scope on packed rows, or None: the stack is not the proven
    one, the config's scope is not the partial one (the provider sets it, :mod:`bridge_cudagraph.bridge.mixin`), or a
    setting megatron-core's own partial replay handles otherwise (expert-parallel overlap returns four tensors
    instead of the layer's output)."""
    from bridge_cudagraph.host.compat import moe_partial_capture_is_mirrored

    config = layer.config
    if not moe_partial_capture_is_mirrored():
        return "the installed megatron-core is not the release whose partial MoE replay this mirrors"
    if getattr(config, "cuda_graph_impl", None) != "transformer_engine" or not partial_scope(config):
        return "config.cuda_graph_modules lacks moe_router and moe_preprocess (the provider sets them on packed rows)"
    if getattr(config, "overlap_moe_expert_parallel_comm", False):
        return "model.overlap_moe_expert_parallel_comm=true splits the layer into fine-grained callables"
    return None


def attention(layer: Any, hidden_states: Any, rotary_pos_emb: Any, packed_seq_params: Any) -> Any:
    """``TransformerLayer._forward_attention`` on packed rows (no attention mask: the boundaries are in
    ``packed_seq_params``); the hidden states after the attention's residual add."""
    hidden_states, _ = layer._forward_attention(
        hidden_states=hidden_states,
        attention_mask=None,
        rotary_pos_emb=rotary_pos_emb,
        packed_seq_params=packed_seq_params,
    )
    return hidden_states


def mlp_head(layer: Any, hidden_states: Any, padding_mask: Any) -> list:
    """``TransformerLayer._forward_mlp`` while a graph captures it in the partial scope: the MoE layer routes (the
    ``padding_mask``, ``[1, rows]`` with True on padding, keeps those rows out of the auxiliary and z losses and their
    token counts), preprocesses, and returns early (``MoECudaGraphPartialCaptureSignal.get_early_return_outputs``);
    the list is ``[hidden_states, probs, *dispatcher tensors, (shared experts' output), residual]``.

    ``packed_seq_params`` is left out on purpose: megatron-core reads it only for ``tokens_per_sample``
    (``_maybe_unflatten_for_moe``), which Bridge's packing never sets and the packed replay refuses."""
    outputs = layer._forward_mlp(hidden_states, padding_mask=padding_mask)
    if not isinstance(outputs, list | tuple):
        raise RuntimeError(
            "bridge_cudagraph: an MoE layer's forward ran to its end inside a packed MoE capture; megatron-core's "
            "capture flag or the layer's cuda_graph_modules is not what the partial scope needs"
        )
    return list(outputs)


def dispatcher_shapes(layer: Any) -> dict[str, Any]:
    """The token dispatcher's non-tensor attributes among ``cudagraph_attrs`` (top-level names) and
    :data:`SHAPE_ATTRIBUTES`, as they are now: right after a rung's capture they are that rung's (the input's shape,
    ``num_out_tokens`` of a dropless dispatcher: rows x top-k), which its replays need back."""
    import torch

    dispatcher = layer.mlp.token_dispatcher
    names = [n for n in getattr(dispatcher, "cudagraph_attrs", ()) if "." not in n] + list(SHAPE_ATTRIBUTES)
    return {
        name: getattr(dispatcher, name)
        for name in names
        if hasattr(dispatcher, name) and not isinstance(getattr(dispatcher, name), torch.Tensor)
    }


def _shares_expert_output(config: Any) -> bool:
    """Whether the graph also returns the shared experts' output (computed in the graph, not overlapped)."""
    return config.moe_shared_expert_intermediate_size is not None and not config.moe_shared_expert_overlap


def resume(layer: Any, outputs: Sequence[Any], shapes: dict[str, Any]) -> Any:
    """The eager remainder of an MoE layer after its graph, as ``TransformerLayer._te_cuda_graph_replay_impl`` runs it
    in its ``moe_router`` branch with ``moe_preprocess`` captured: the dispatcher's tensors from the graph's outputs
    (in ``valid_cudagraph_attrs``' order) and ``shapes`` (:func:`dispatcher_shapes` of the rung) put back, the
    preprocessed hidden states and probabilities put in the layer's ``cudagraph_tensor_store`` so that the MoE layer
    skips its route and preprocess, then dispatch, experts and combine, then ``_forward_post_mlp`` on the graph's
    residual. Returns the layer's output."""
    from megatron.core.typed_torch import apply_module

    config = layer.config
    outputs = list(outputs)
    residual = outputs.pop()
    shared = outputs.pop() if _shares_expert_output(config) else None
    (hidden_states, probs), tensors = outputs[:2], outputs[2:]
    mlp = layer.mlp
    dispatcher = mlp.token_dispatcher
    names = dispatcher.valid_cudagraph_attrs or []
    if len(tensors) != len(names):
        raise RuntimeError(
            f"bridge_cudagraph: a packed MoE graph returned {len(tensors)} dispatcher tensors for the "
            f"{len(names)} the dispatcher names ({names})"
        )
    for name, value in zip(names, tensors, strict=True):
        *path, last = name.split(".")
        owner = dispatcher
        for part in path:
            owner = getattr(owner, part)
        setattr(owner, last, value)
    for name, value in shapes.items():
        setattr(dispatcher, name, value)
    mlp.cudagraph_tensor_store.set(hidden_states=hidden_states, probs=probs, shared_expert_output=shared)
    try:
        mlp_output_with_bias = apply_module(mlp)(hidden_states)
    finally:
        mlp.cudagraph_tensor_store.clear()
    # The graph registered any pre-MLP norm recompute on its outputs; the post-MLP step must not register it again.
    recompute = layer.recompute_pre_mlp_layernorm
    layer.recompute_pre_mlp_layernorm = False
    try:
        return layer._forward_post_mlp(mlp_output_with_bias, residual)
    finally:
        layer.recompute_pre_mlp_layernorm = recompute
