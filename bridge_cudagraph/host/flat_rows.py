"""The Qwen3-VL step's packed rows handed to Bridge's forward already flat (:class:`FlatPackedRows`), what
``model.cuda_graph.forward.flat_rows`` switches.

Host change:
  changes: the class of one ``Qwen3VLModel`` (:class:`FlatPackedRows` in front, behind
    :class:`~bridge_cudagraph.host.rope_index.CpuRopeIndex`); the forward's arguments handed on flat
    (:func:`flat_step_rows`)
  written for: Megatron-Bridge 0.6.2 ``Qwen3VLModel.forward``, ``preprocess_packed_seqs``
  gate: as :mod:`~bridge_cudagraph.host.forward`, which installs it; ``model.cuda_graph.forward.flat_rows``
  undo: :func:`~bridge_cudagraph.host.forward.uninstall`

Only where Bridge's own packing gives exactly the flatten (every token kept, context parallelism off); a mask that
drops tokens raises. The positions are derived per row first, as Bridge derives them, which is why this mixin sits
behind :class:`~bridge_cudagraph.host.rope_index.CpuRopeIndex`.
"""

from __future__ import annotations

from typing import Any

import torch

from bridge_cudagraph.host.forward_counts import counts_of
from bridge_cudagraph.host.instance_class import HostMixin
from bridge_cudagraph.micro_batch import current_micro_batch

__all__ = ["FlatPackedRows", "flat_step_rows"]


def flat_step_rows(model: Any, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """``kwargs`` with the step's packed rows already flat, where Bridge's forward would pack them into exactly that
    (see the module docstring); None where its packing is anything else or the batch is not the step's packed rows.

    Bridge's ``preprocess_packed_seqs`` puts row ``i``'s tokens that the attention mask keeps at the ``i``-th offset
    of their counts padded to the tensor-parallel size (context parallelism splits them further). Where the mask
    keeps every token (the step's mask is all ones; none: the forward makes that one) every count is the width; with
    context parallelism off and the width a multiple of the tensor-parallel size nothing is padded, so the packed
    tensor is the flatten. The mask's values are on the GPU: :class:`FlatPackedRows` has them checked on the CPU
    copy :class:`~bridge_cudagraph.host.rope_index.PendingPositions` makes with the tokens' (no wait), so this
    function looks at its shape only. Explicit mRoPE positions are required (the forward derives missing ones from its
    tokens, per row only in its packed-BSHD branch): :class:`~bridge_cudagraph.host.rope_index.CpuRopeIndex` passes
    them. Embedding dropout would draw its mask over the embeddings' other layout, so a model training with it is left
    to Bridge, as are explicit image or video masks (Bridge's branch reads them in the rows' shape)."""
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.model import _is_mrope_position_ids

    input_ids = kwargs.get("input_ids")
    positions = kwargs.get("position_ids")
    mask = kwargs.get("attention_mask")
    if not (
        kwargs.get("packed_seq_params") is not None
        and isinstance(input_ids, torch.Tensor)
        and input_ids.dim() == 2
        and input_ids.size(0) > 1
        and (mask is None or (isinstance(mask, torch.Tensor) and tuple(mask.shape) == tuple(input_ids.shape)))
        and kwargs.get("image_input_mask") is None
        and kwargs.get("video_input_mask") is None
        and kwargs.get("inference_params") is None
        and isinstance(positions, torch.Tensor)  # as _is_mrope_position_ids checks (for the type checker)
        and _is_mrope_position_ids(positions)
        and tuple(positions.shape[1:]) == tuple(input_ids.shape)
    ):
        return None
    groups = model.pg_collection
    if groups.cp.size() != 1 or input_ids.size(1) % groups.tp.size() != 0:
        return None
    if model.training and getattr(model, "pre_process", False) and model.language_model.config.hidden_dropout > 0:
        return None
    # Views: CpuRopeIndex fills its positions after this call, in the storage handed on here. The forward's one-row
    # THD branch reads no attention mask (it sets none for the language model).
    flat = {"input_ids": input_ids.reshape(1, -1), "position_ids": positions.reshape(3, 1, -1), "attention_mask": None}
    return {**kwargs, **flat}


class FlatPackedRows(HostMixin):
    """Mixin for Bridge's ``Qwen3VLModel``: the step's packed rows handed to its forward flat
    (:func:`flat_step_rows`; see the module docstring)."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Bridge's forward, given the rows flat where :func:`flat_step_rows` says its packing is the flatten. An
        attention mask must keep every token: the pending positions of
        :class:`~bridge_cudagraph.host.rope_index.CpuRopeIndex` (in the micro-batch) check their CPU copy of it when
        they fill (a mask that drops tokens raises there, before the language model runs); without them the rows are
        left to Bridge."""
        flat = None if args else flat_step_rows(self, kwargs)
        if flat is not None and kwargs.get("attention_mask") is not None:
            micro_batch = current_micro_batch()
            pending = None if micro_batch is None else micro_batch.pending_positions
            if pending is None or pending.model is not self or pending.attention_mask is None:
                flat = None
            else:
                pending.require_unpadded_rows()
        if flat is None:
            return super().forward(*args, **kwargs)
        counts = counts_of(self)
        if counts is not None:
            counts.flat_batches += 1
        return super().forward(**flat)
