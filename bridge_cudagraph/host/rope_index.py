"""Qwen3-VL's mRoPE positions from one CPU copy of the tokens and grids (:class:`CpuRopeIndex`), what
``model.cuda_graph.forward.positions`` switches.

Host change:
  changes: the class of one ``Qwen3VLModel`` (:class:`CpuRopeIndex` in front) and a forward pre-hook on its input
    embedding (:func:`fill_at_embedding`); where the packed replay packs rows tightly, a CPU copy of the ``loss_mask``
    beside the tokens' and the rows' extents in the micro-batch (:class:`PendingPositions`)
  written for: Megatron-Bridge 0.6.2 ``Qwen3VLModel.forward``, ``get_rope_index``
  gate: as :mod:`~bridge_cudagraph.host.forward`, which installs it; ``model.cuda_graph.forward.positions``
  undo: :func:`~bridge_cudagraph.host.forward.uninstall`

The positions are Bridge's own ``get_rope_index`` output, bitwise: the same function on CPU copies of its inputs,
enqueued at the forward's start and derived while the GPU runs the vision encoder (``docs/design/host-waits.md``).
The pending positions and the rows' extents live in the forward step's
:class:`~bridge_cudagraph.micro_batch.MicroBatch` for the length of one forward.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable
from typing import Any

import torch

from bridge_cudagraph.host.forward_counts import counts_of
from bridge_cudagraph.host.instance_class import HostMixin
from bridge_cudagraph.micro_batch import MicroBatch, current_micro_batch, within_micro_batch

__all__ = ["CpuRopeIndex", "PendingPositions", "fill_at_embedding", "fills_at_embedding", "rope_positions"]

#: The ``PackedSeqParams`` fields Bridge's ``get_rope_index`` reads on the CPU (``_get_flat_packed_ranges``,
#: ``get_packed_seq_attention_mask``).
_PACKED_OFFSETS = ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded")


def _to_cpu(tensor: torch.Tensor | None, micro_batch: MicroBatch) -> torch.Tensor | None:
    """A CPU copy: the one ``micro_batch`` bound (:class:`~bridge_cudagraph.host.bound_grids.BoundGrids`), else a
    pinned one, enqueued without waiting (the caller waits on an event recorded after its copies)."""
    if tensor is None or not tensor.is_cuda:
        return tensor
    bound = micro_batch.cpu_copy(tensor)
    return bound if bound is not None else tensor.to("cpu", non_blocking=True)


def rope_positions(model: Any, kwargs: dict[str, Any]) -> torch.Tensor:
    """The positions Bridge's forward derives for these inputs: its ``get_rope_index`` call, with its arguments
    (wherever the tensors are; :class:`PendingPositions` hands it CPU copies)."""
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.rope import get_rope_index

    input_ids = kwargs["input_ids"]
    packed = kwargs.get("packed_seq_params")
    # Bridge's forward: a 2-D packed batch with more than one row is its legacy packed BSHD path, whose positions are
    # derived unpacked (packed_seq_params=None) and packed afterwards, by the forward itself.
    if packed is not None and input_ids.size(0) > 1:
        packed = None
    positions, _ = get_rope_index(
        model.config.spatial_merge_size,
        model.image_token_id,
        model.video_token_id,
        model.vision_start_token_id,
        input_ids,
        image_grid_thw=kwargs.get("image_grid_thw"),
        video_grid_thw=kwargs.get("video_grid_thw"),
        attention_mask=None,  # Bridge's forward passes None (its hf_attention_mask)
        packed_seq_params=packed,
    )
    return positions


class PendingPositions:
    """One forward's positions: the CPU copies of its tokens, grids and offsets enqueued at once (no wait), the
    positions derived from them and uploaded into :attr:`positions` by :meth:`fill`.

    :attr:`positions` is allocated at once, so Bridge's forward can be handed it before it holds anything: no kernel
    reads ``position_ids`` before the forward's input embedding (the positions are used only after the image-token
    merge), and :class:`CpuRopeIndex` fills it just before that embedding runs. By then the vision encoder's work is
    queued, so the CPU derives the positions while the GPU runs it, and waits only for the copies (an event), not
    for the queue to drain."""

    def __init__(self, model: Any, kwargs: dict[str, Any], micro_batch: MicroBatch) -> None:
        input_ids = kwargs["input_ids"]
        #: The model whose forward these positions are for.
        self.model = model
        self._micro_batch = micro_batch
        packed = kwargs.get("packed_seq_params")
        if packed is not None:
            packed = copy.copy(packed)  # a shallow copy: __post_init__ is not run again
            for name in _PACKED_OFFSETS:
                setattr(packed, name, _to_cpu(getattr(packed, name, None), micro_batch))
        self._packed = kwargs.get("packed_seq_params")
        loss_mask = kwargs.get("loss_mask") if self._packed is not None and _wants_extents(model) else None
        self._loss_mask = _to_cpu(loss_mask, micro_batch) if isinstance(loss_mask, torch.Tensor) else None
        # The step's packed rows: the attention mask FlatPackedRows needs to keep every token (checked at fill).
        mask = kwargs.get("attention_mask") if self._packed is not None else None
        self.attention_mask = _to_cpu(mask, micro_batch) if isinstance(mask, torch.Tensor) else None
        self._rows_must_be_unpadded = False
        self._cpu: dict[str, Any] = {
            "input_ids": _to_cpu(input_ids, micro_batch),
            "image_grid_thw": _to_cpu(kwargs.get("image_grid_thw"), micro_batch),
            "video_grid_thw": _to_cpu(kwargs.get("video_grid_thw"), micro_batch),
            "packed_seq_params": packed,
        }
        self._copied = torch.cuda.Event()
        self._copied.record()
        self.positions = torch.empty((3, *input_ids.shape), dtype=input_ids.dtype, device=input_ids.device)
        self.filled = False

    def fill(self) -> None:
        """Derive the positions from the CPU copies (waiting for those copies only) and upload them."""
        self._copied.synchronize()
        positions = rope_positions(self.model, self._cpu)
        # get_rope_index's text-only branch returns an expanded view; pinned memory needs dense storage.
        self.positions.copy_(positions.contiguous().pin_memory(), non_blocking=True)
        self.filled = True
        self._set_extents()
        self._check_unpadded()

    def require_unpadded_rows(self) -> None:
        """Make :meth:`fill` (now, if it has run) raise unless the CPU copy of the attention mask keeps every token:
        what :class:`~bridge_cudagraph.host.flat_rows.FlatPackedRows` needs of the rows it hands the forward flat."""
        self._rows_must_be_unpadded = True
        if self.filled:
            self._check_unpadded()

    def _check_unpadded(self) -> None:
        if not self._rows_must_be_unpadded:
            return
        assert self.attention_mask is not None  # FlatPackedRows requires unpadded rows only where a mask was copied
        if not bool(self.attention_mask.all()):
            raise RuntimeError(
                "bridge_cudagraph: the step's packed Qwen3-VL rows came with an attention mask that drops tokens; "
                "model.cuda_graph.forward.flat_rows hands such rows to Bridge's forward flat only where the mask "
                "keeps every token (Bridge's qwen3_vl_step builds it so). Set "
                "model.cuda_graph.forward.flat_rows=false to let Bridge's forward pack them itself"
            )

    def _set_extents(self) -> None:
        """Each row's extent (:func:`bridge_cudagraph.micro_batch.row_extents`) in the micro-batch, keyed by this
        forward's ``packed_seq_params`` object (CPU copies only: nothing waits)."""
        from bridge_cudagraph.micro_batch import row_extents as extents_of

        if self._packed is None or self._loss_mask is None or _decoder_of(self.model) is None:
            return
        visual = [getattr(self.model, n, None) for n in ("image_token_id", "video_token_id")]
        extents = extents_of(self._loss_mask, self._cpu["input_ids"], [t for t in visual if t is not None])
        if extents is not None:
            self._micro_batch.row_extents = (self._packed, tuple(extents))


class CpuRopeIndex(HostMixin):
    """Mixin for Bridge's ``Qwen3VLModel``: the mRoPE positions from one CPU copy (see the module docstring)."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Bridge's forward, given the positions its ``get_rope_index`` would compute on the GPU's tensors.

        Only where Bridge would call it with these very arguments: keyword inputs (as Bridge's step passes them), the
        tokens on the GPU, no explicit mRoPE positions, no inference state, and context parallel size 1 (with
        more, Bridge computes positions for the full sequence and splits them; left to it). On the first pipeline
        stage the positions are filled when the input embedding is about to run (:func:`fill_at_embedding`);
        elsewhere at once."""
        if args or not self._positions_are_derived(kwargs):
            return super().forward(*args, **kwargs)
        with within_micro_batch() as micro_batch:
            pending = PendingPositions(self, kwargs, micro_batch)
            kwargs["position_ids"] = pending.positions
            counts = counts_of(self)
            if counts is not None:
                counts.cpu_positions_calls += 1
            if not fills_at_embedding(self):
                pending.fill()
            # Visible to FlatPackedRows behind this mixin until the embedding's hook takes it (or, filled, throughout).
            previous, micro_batch.pending_positions = micro_batch.pending_positions, pending
            try:
                output = super().forward(*args, **kwargs)
            finally:
                micro_batch.pending_positions = previous
                micro_batch.row_extents = None
        if not pending.filled:
            raise RuntimeError(
                "bridge_cudagraph: Qwen3-VL's forward read no input embedding, so its mRoPE positions were never "
                "filled; set model.cuda_graph.forward.positions=false"
            )
        return output

    def _positions_are_derived(self, kwargs: dict[str, Any]) -> bool:
        # Bridge's own test of explicit positions, which its forward keeps instead of deriving them.
        from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.model import _is_mrope_position_ids

        input_ids = kwargs.get("input_ids")
        return (
            isinstance(input_ids, torch.Tensor)
            and input_ids.is_cuda
            and input_ids.dim() == 2
            and not _is_mrope_position_ids(kwargs.get("position_ids"))
            and kwargs.get("inference_params") is None
            and self.pg_collection.cp.size() == 1
        )


def _embedding_of(model: Any) -> Any:
    return getattr(getattr(model, "language_model", None), "embedding", None)


def fills_at_embedding(model: Any) -> bool:
    """Whether ``model``'s positions are filled by the pre-hook on its input embedding (:func:`fill_at_embedding`,
    which the installer puts on exactly there: the first pipeline stage) rather than at the forward's start."""
    return bool(getattr(model, "pre_process", False)) and _embedding_of(model) is not None


def fill_at_embedding(model_ref: weakref.ref) -> Callable[..., None]:
    """The input embedding's forward pre-hook: fill the pending positions of this model's forward (taking them out
    of the micro-batch) just before the embedding runs."""

    def hook(module: Any, args: Any) -> None:
        model = model_ref()
        micro_batch = current_micro_batch()
        pending = None if micro_batch is None else micro_batch.pending_positions
        if model is None or micro_batch is None or pending is None or pending.model is not model:
            return
        micro_batch.pending_positions = None
        if not pending.filled:
            pending.fill()

    return hook


def _decoder_of(model: Any) -> Any:
    return getattr(getattr(model, "language_model", None), "decoder", None)


def _wants_extents(model: Any) -> bool:
    """Whether the decoder's packed replay packs rows tightly: only then is the ``loss_mask`` copied to the CPU and
    the rows' extents derived (a copy and CPU work per micro-batch that nothing else reads)."""
    helper = getattr(_decoder_of(model), "ladder_helper", None)
    return bool(getattr(helper, "tight", False))
