"""Rebuild Qwen3-VL's vision encoder under its own process groups.

Bridge's ``Qwen3VLModel`` builds the encoder with the *language* collection, so vision tensor parallelism is
tied to the language model's (``model.py`` ``Qwen3VLVisionModel(..., pg_collection=pg_collection)``, and
``get_vision_model_config`` copies the language TP size). Layers are bound to their groups at construction,
so handing a helper another collection later changes nothing; the encoder has to be built again. This module
holds what the rebuild (:func:`bridge_cudagraph.host.encoder_swap.rebuild_vision_encoder`, right after Bridge's
``provide()``) puts in place:

* the vision collection (its own ``HyperCommGrid`` on the language model's first pipeline stage, tensor
  parallel size ``cuda_graph.vision.tensor_parallel_size``, 1 by default);
* a copy of Bridge's vision config with that TP size, sequence parallelism off, and Megatron-Core's graph
  routing off (``cuda_graph_impl="none"``): our :class:`~bridge_cudagraph.capture.vision.VisionGraphHelper`
  replays the layers itself, in eager semantics;
* Bridge's freeze flags re-applied to the new encoder;
* gradient-norm bookkeeping for replicas (:func:`mark_vision_replicas`).

The rebuilt encoder is a :class:`GraphedQwen3VLVisionModel`: Bridge's encoder whose training forward a
:class:`~bridge_cudagraph.capture.vision.VisionGraphHelper`, once attached, replays on its graphs. It lives apart from
the capture, so that code which only needs to find or build the encoder does not import the capture machinery; this
module imports nothing from :mod:`bridge_cudagraph.capture`.
"""

from __future__ import annotations

from typing import Protocol

import torch
from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.vision_model import Qwen3VLVisionModel

from bridge_cudagraph.vision.positions import GridPositions, rotary_input


def frame_seqlens(grid_thw: torch.Tensor) -> torch.Tensor:
    """Patches per attention segment: every frame of every image is one segment (Bridge's eager layout).

    From the CPU grid's Python ints: torch's CPU ``repeat_interleave`` opens an OpenMP parallel region on every call
    (its loop over the images has grain 1), which took 1.8-6.6 ms of CPU time per step while the GPU waited for a
    handful of integers."""
    rows = grid_thw.tolist()
    return torch.tensor([h * w for t, h, w in rows for _ in range(t)], dtype=grid_thw.dtype)


class EncoderReplay(Protocol):
    """What :class:`GraphedQwen3VLVisionModel` asks of its graph helper (as the language decoder asks its ladder's,
    :class:`~bridge_cudagraph.capture.block_replay.BlockReplay`)."""

    def replay_encoder(
        self, encoder: GraphedQwen3VLVisionModel, hidden_states: torch.Tensor, grid_thw: torch.Tensor, inference_params
    ) -> tuple[torch.Tensor, list[torch.Tensor]] | None:
        """The encoder's training forward on the graphs, or None: Bridge's forward runs."""


class GraphedQwen3VLVisionModel(Qwen3VLVisionModel):
    """Bridge's Qwen3-VL vision encoder, built under the vision collection, whose training forward is first offered
    to the :class:`~bridge_cudagraph.capture.vision.VisionGraphHelper` attached as its ``graph_helper``
    (:meth:`~bridge_cudagraph.capture.vision.VisionGraphHelper.replay_encoder`): the helper replays its graphs, or
    declines and Bridge's eager forward runs."""

    graph_helper: EncoderReplay | None = None
    """A :class:`~bridge_cudagraph.capture.vision.VisionGraphHelper` once attached (not imported: it imports this
    module)."""
    position_cache_size: int = 256
    """Image sizes whose position indices, weights and rotary rows a replaying encoder keeps
    (:class:`~bridge_cudagraph.vision.positions.GridPositions`); 0 derives them on every micro-batch as Bridge does
    (the benchmark's lever ``ours_uncached_positions``)."""

    def grid_positions(self) -> GridPositions | None:
        """This encoder's :class:`~bridge_cudagraph.vision.positions.GridPositions`, or None when
        :attr:`position_cache_size` is 0."""
        if self.position_cache_size <= 0:
            return None
        cache = self.__dict__.get("_grid_positions")
        if cache is None:
            cache = self.__dict__["_grid_positions"] = GridPositions(self.position_cache_size)
        return cache

    def position_inputs(self, grid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The position embeddings and the rotary input for the CPU ``grid``: Bridge's own
        (``fast_pos_embed_interpolate``, ``rot_pos_emb``), or the same values from :meth:`grid_positions` for an image
        size seen before."""
        positions = self.grid_positions()
        if positions is None:
            return self.fast_pos_embed_interpolate(grid), rotary_input(self.rot_pos_emb(grid))
        return positions.positions(self, grid)

    def forward(self, hidden_states, grid_thw, inference_params=None, extra_block_kwargs=None):
        helper = self.graph_helper
        if helper is not None and self.training and not extra_block_kwargs:
            out = helper.replay_encoder(self, hidden_states, grid_thw, inference_params)
            if out is not None:
                return out
        return super().forward(hidden_states, grid_thw, inference_params, extra_block_kwargs)


def vision_spec():
    """Bridge's Qwen3-VL vision layer and patch-merger specs (``model.py``), TE layers throughout."""
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.attention import Qwen3VLSelfAttention
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.utils import PatchMergerSubmodules
    from megatron.core.extensions.transformer_engine import TEColumnParallelLinear, TENorm, TERowParallelLinear
    from megatron.core.models.vision.vit_layer_specs import get_vit_layer_with_transformer_engine_spec

    layer_spec = get_vit_layer_with_transformer_engine_spec()
    layer_spec.submodules.self_attention.module = Qwen3VLSelfAttention
    merger_spec = PatchMergerSubmodules(
        patch_norm=TENorm, linear_fc1=TEColumnParallelLinear, linear_fc2=TERowParallelLinear
    )
    return layer_spec, merger_spec


def mark_vision_replicas(vision_model: torch.nn.Module, *, language_tp_rank: int, vision_tp: int) -> None:
    """Make Megatron's gradient norm count each vision parameter once per language model-parallel group.

    The optimizer's norm (``param_is_not_tensor_parallel_duplicate``) sums squared gradients over parameters
    that are ``tensor_model_parallel`` or live on tensor-parallel rank 0 of the *language* group, then
    all-reduces over the language model-parallel group.
    With vision TP smaller than language TP, the language TP group holds ``language_tp / vision_tp`` replicas of
    every vision shard, and TE marks even TP-1 weights ``tensor_model_parallel=True``: upstream would count them
    ``language_tp / vision_tp`` times. Vision tensor-parallel groups are contiguous, so the language TP ranks
    ``0 .. vision_tp-1`` hold exactly one copy of every shard: only they count.
    """
    holds_one_copy = language_tp_rank < vision_tp
    for param in vision_model.parameters():
        sharded = bool(getattr(param, "tensor_model_parallel", False)) and vision_tp > 1
        # Sharded weights: counted on the ranks holding one copy of every shard. Replicated ones (norms, TP-1
        # weights): left False, so the optimizer counts them on language TP rank 0 only.
        param.tensor_model_parallel = sharded and holds_one_copy  # type: ignore[attr-defined]  # Megatron's flag
