"""Qwen3-VL's forward with fewer host waits: what ``model.cuda_graph.forward`` switches, one setting per part
(:data:`MECHANISMS`; null: on wherever graphs are on a Qwen3-VL model).

Host change:
  changes: the class of one ``Qwen3VLModel`` and its decoder (mixins in front,
    :func:`~bridge_cudagraph.host.patches.extend_instance_class`), a forward pre-hook on its input embedding and a
    forward hook on its encoder; mirrors parts of Bridge's Qwen3-VL forward; where the packed replay packs rows
    tightly, a host copy of the ``loss_mask`` beside the tokens' and, in the decoder's instance dict while one
    forward runs, the rows' extents for tight packing (:func:`row_extents`); for the step's packed rows, a host copy
    of their attention mask and the forward's arguments handed on flat (:func:`flat_step_rows`); while one forward
    runs, the micro-batch's published host grids bound to its grid arguments (:class:`BoundGrids`)
  written for: Megatron-Bridge 0.6.2 ``Qwen3VLModel.forward``, ``get_rope_index``, ``_deepstack_process``,
    ``preprocess_packed_seqs``
  gate: the proven stack (:func:`~bridge_cudagraph.host.compat.check_proven_stack`);
    :func:`~bridge_cudagraph.host.compat.qwen3_vl_forward_is_mirrored`; ``model.cuda_graph.forward``
  undo: :func:`uninstall`

What each mixin takes off, in one line each (the reasoning, and what was measured, is in
``docs/design/host-waits.md``); every one computes the same values, bitwise, as Bridge's forward:

* :class:`HostRopeIndex` / :class:`PendingPositions`: the mRoPE positions from Bridge's own ``get_rope_index`` on host
  copies of the tokens and grids, enqueued at the forward's start and filled before the input embedding runs;
* :class:`IndexedDeepstack`: the deepstack merges by row positions (``nonzero_static``, the count asserted on the
  device) instead of a boolean mask;
* :class:`RowMerge` / :class:`VisionRows`: the image-token merge by positions, the same ``index_put_``;
* the rows' extents for tight packing (:func:`row_extents`), published on the decoder for one ``packed_seq_params``;
* :class:`FlatPackedRows`: the step's packed rows handed to the forward flat (:func:`flat_step_rows`) where Bridge's
  own packing would give exactly that (every token kept, context parallelism off); a mask that drops tokens raises;
* :class:`BoundGrids`: the collate's host grids (:mod:`bridge_cudagraph.vision.host_grids`) bound to the device
  tensors this call received, checked on the device.

They are mixins put on one model's objects by :func:`install` (:func:`~bridge_cudagraph.host.patches.
extend_instance_class`; the model's instance dict gets call counters and its hooks' handles, nothing the host
saves or reads) and taken off by :func:`uninstall`; the callback and the benchmark call them through
:mod:`bridge_cudagraph.host.step`. They mirror Bridge 0.6's forward (:func:`bridge_cudagraph.host.compat.
qwen3_vl_forward_is_mirrored`); on another release nothing is installed. :class:`FlatPackedRows` sits behind
:class:`HostRopeIndex` on the same model (the positions are derived per row first, as Bridge derives them).
"""

from __future__ import annotations

import copy
import logging
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

from bridge_cudagraph.host import compat
from bridge_cudagraph.host.instance_class import extend_instance_class, restore_instance_class
from bridge_cudagraph.vision import host_grids

__all__ = [
    "MECHANISMS",
    "BoundGrids",
    "FlatPackedRows",
    "HostRopeIndex",
    "IndexedDeepstack",
    "PendingPositions",
    "RowMerge",
    "VisionRows",
    "counts",
    "counts_in",
    "flat_batches",
    "flat_step_rows",
    "grid_binds",
    "host_positions_calls",
    "install",
    "installed",
    "publish_row_extents",
    "rope_positions",
    "row_extents",
    "row_merges",
    "uninstall",
]

logger = logging.getLogger(__name__)

#: The ``PackedSeqParams`` fields Bridge's ``get_rope_index`` reads on the host (``_get_flat_packed_ranges``,
#: ``get_packed_seq_attention_mask``).
_PACKED_OFFSETS = ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded")


def _to_host(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """A host copy: the one :class:`BoundGrids` bound, else a pinned one, enqueued without waiting (the caller waits on
    an event recorded after its copies)."""
    if tensor is None or not tensor.is_cuda:
        return tensor
    bound = host_grids.host_copy(tensor)
    return bound if bound is not None else tensor.to("cpu", non_blocking=True)


def rope_positions(model: Any, kwargs: dict[str, Any]) -> torch.Tensor:
    """The positions Bridge's forward derives for these inputs: its ``get_rope_index`` call, with its arguments
    (wherever the tensors are; :class:`PendingPositions` hands it host copies)."""
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
    """One micro-batch's positions: the host copies of its tokens, grids and offsets enqueued at once (no wait), the
    positions derived from them and uploaded into :attr:`positions` by :meth:`fill`.

    :attr:`positions` is allocated at once, so Bridge's forward can be handed it before it holds anything: no kernel
    reads ``position_ids`` before the forward's input embedding (the positions are used only after the image-token
    merge), and :class:`HostRopeIndex` fills it just before that embedding runs. By then the vision encoder's work is
    queued, so the host derives the positions while the GPU runs it, and waits only for the copies (an event), not
    for the queue to drain."""

    def __init__(self, model: Any, kwargs: dict[str, Any]) -> None:
        input_ids = kwargs["input_ids"]
        self._model = model
        packed = kwargs.get("packed_seq_params")
        if packed is not None:
            packed = copy.copy(packed)  # a shallow copy: __post_init__ is not run again
            for name in _PACKED_OFFSETS:
                setattr(packed, name, _to_host(getattr(packed, name, None)))
        self._packed = kwargs.get("packed_seq_params")
        loss_mask = kwargs.get("loss_mask") if self._packed is not None and _wants_extents(model) else None
        self._loss_mask = _to_host(loss_mask) if isinstance(loss_mask, torch.Tensor) else None
        # The step's packed rows: the attention mask FlatPackedRows needs to keep every token (checked at fill).
        mask = kwargs.get("attention_mask") if self._packed is not None else None
        self.attention_mask = _to_host(mask) if isinstance(mask, torch.Tensor) else None
        self._rows_must_be_unpadded = False
        self._host = {
            "input_ids": _to_host(input_ids),
            "image_grid_thw": _to_host(kwargs.get("image_grid_thw")),
            "video_grid_thw": _to_host(kwargs.get("video_grid_thw")),
            "packed_seq_params": packed,
        }
        self._copied = torch.cuda.Event()
        self._copied.record()
        self.positions = torch.empty((3, *input_ids.shape), dtype=input_ids.dtype, device=input_ids.device)
        self.filled = False

    def fill(self) -> None:
        """Derive the positions from the host copies (waiting for those copies only) and upload them."""
        self._copied.synchronize()
        positions = rope_positions(self._model, self._host)
        # get_rope_index's text-only branch returns an expanded view; pinned memory needs dense storage.
        self.positions.copy_(positions.contiguous().pin_memory(), non_blocking=True)
        self.filled = True
        self._publish_extents()
        self._check_unpadded()

    def require_unpadded_rows(self) -> None:
        """Make :meth:`fill` (now, if it has run) raise unless the host copy of the attention mask keeps every token:
        what :class:`FlatPackedRows` needs of the rows it hands the forward flat."""
        self._rows_must_be_unpadded = True
        if self.filled:
            self._check_unpadded()

    def _check_unpadded(self) -> None:
        if self._rows_must_be_unpadded and not bool(self.attention_mask.all()):
            raise RuntimeError(
                "bridge_cudagraph: the step's packed Qwen3-VL rows came with an attention mask that drops tokens; "
                "model.cuda_graph.forward.flat_rows hands such rows to Bridge's forward flat only where the mask "
                "keeps every token (Bridge's qwen3_vl_step builds it so). Set "
                "model.cuda_graph.forward.flat_rows=false to let Bridge's forward pack them itself"
            )

    def _publish_extents(self) -> None:
        """Each row's extent (:func:`bridge_cudagraph.capture.tight.row_extents`) on the decoder, keyed by this
        micro-batch's ``packed_seq_params`` object (host copies only: nothing waits)."""
        from bridge_cudagraph.capture.tight import row_extents as extents_of

        decoder = _decoder_of(self._model)
        if self._packed is None or self._loss_mask is None or decoder is None:
            return
        visual = [getattr(self._model, n, None) for n in ("image_token_id", "video_token_id")]
        extents = extents_of(self._loss_mask, self._host["input_ids"], [t for t in visual if t is not None])
        if extents is not None:
            publish_row_extents(decoder, self._packed, extents)


class HostRopeIndex:
    """Mixin for Bridge's ``Qwen3VLModel``: the mRoPE positions from one host copy (see the module docstring)."""

    #: Micro-batches whose positions came from the host copy; what a test asserts is > 0.
    host_positions_calls: int = 0

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Bridge's forward, given the positions its ``get_rope_index`` would compute on the GPU's tensors.

        Only where Bridge would call it with these very arguments: keyword inputs (as Bridge's step passes them), the
        tokens on the GPU, no explicit mRoPE positions, no inference state, and context parallel size 1 (with
        more, Bridge computes positions for the full sequence and splits them; left to it). On the first pipeline
        stage the positions are filled when the input embedding is about to run (:func:`install` puts the hook on
        it); elsewhere at once."""
        if args or not self._positions_are_derived(kwargs):
            return super().forward(*args, **kwargs)
        pending = PendingPositions(self, kwargs)
        kwargs["position_ids"] = pending.positions
        self.host_positions_calls += 1
        if _EMBEDDING_HOOK not in self.__dict__:
            pending.fill()
        # Visible to FlatPackedRows behind this mixin until the embedding's hook takes it (or, filled, throughout).
        self.__dict__[_PENDING] = pending
        try:
            output = super().forward(*args, **kwargs)
        finally:
            self.__dict__.pop(_PENDING, None)
            _drop_extents(self)
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


#: Instance-dict keys of a model with :class:`HostRopeIndex`: the embedding's pre-hook handle, the pending positions;
#: with :class:`RowMerge`: the encoder's forward-hook handle.
_EMBEDDING_HOOK = "_bridge_cudagraph_positions_hook"
_PENDING = "_bridge_cudagraph_pending_positions"
_VISION_HOOK = "_bridge_cudagraph_vision_rows_hook"
#: The decoder's instance-dict key of ``(packed_seq_params, extents)`` while one micro-batch's forward runs.
_ROW_EXTENTS = "_bridge_cudagraph_row_extents"


def publish_row_extents(decoder: Any, packed_seq_params: Any, extents: tuple[int, ...]) -> None:
    """Hand ``decoder`` the rows' extents of the micro-batch whose ``packed_seq_params`` is this object."""
    decoder.__dict__[_ROW_EXTENTS] = (packed_seq_params, tuple(extents))


def row_extents(decoder: Any, packed_seq_params: Any) -> tuple[int, ...] | None:
    """The rows' extents :class:`PendingPositions` published on ``decoder`` for this very ``packed_seq_params``
    object, or None (another micro-batch's, none published, or :class:`HostRopeIndex` not installed)."""
    entry = getattr(decoder, "__dict__", {}).get(_ROW_EXTENTS)
    if entry is None or entry[0] is not packed_seq_params:
        return None
    return entry[1]


def _decoder_of(model: Any) -> Any:
    return getattr(getattr(model, "language_model", None), "decoder", None)


def _wants_extents(model: Any) -> bool:
    """Whether the decoder's packed replay packs rows tightly: only then is the ``loss_mask`` copied to the host and
    the rows' extents derived (a copy and host work per micro-batch that nothing else reads)."""
    helper = getattr(_decoder_of(model), "ladder_helper", None)
    return bool(getattr(helper, "tight", False))


def _drop_extents(model: Any) -> None:
    decoder = _decoder_of(model)
    if decoder is not None:
        decoder.__dict__.pop(_ROW_EXTENTS, None)


def _fill_pending(model_ref: weakref.ref) -> Callable[..., None]:
    def hook(module: Any, args: Any) -> None:
        model = model_ref()
        pending = None if model is None else model.__dict__.pop(_PENDING, None)
        if pending is not None and not pending.filled:
            pending.fill()

    return hook


def flat_step_rows(model: Any, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """``kwargs`` with the step's packed rows already flat, where Bridge's forward would pack them into exactly that
    (see the module docstring); None where its packing is anything else or the batch is not the step's packed rows.

    Bridge's ``preprocess_packed_seqs`` puts row ``i``'s tokens that the attention mask keeps at the ``i``-th offset
    of their counts padded to the tensor-parallel size (context parallelism splits them further). Where the mask
    keeps every token (the step's mask is all ones; none: the forward makes that one) every count is the width; with
    context parallelism off and the width a multiple of the tensor-parallel size nothing is padded, so the packed
    tensor is the flatten. The mask's values are on the GPU: :class:`FlatPackedRows` has them checked on the host
    copy :class:`PendingPositions` makes with the tokens' (no wait), so this function looks at its shape only.
    Explicit mRoPE positions are required (the forward derives missing ones from its tokens, per row only in its
    packed-BSHD branch): :class:`HostRopeIndex` passes them. Embedding dropout would draw its mask over the
    embeddings' other layout, so a model training with it is left to Bridge, as are explicit image or video masks
    (Bridge's branch reads them in the rows' shape)."""
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
        and _is_mrope_position_ids(positions)
        and tuple(positions.shape[1:]) == tuple(input_ids.shape)
    ):
        return None
    groups = model.pg_collection
    if groups.cp.size() != 1 or input_ids.size(1) % groups.tp.size() != 0:
        return None
    if model.training and getattr(model, "pre_process", False) and model.language_model.config.hidden_dropout > 0:
        return None
    # Views: HostRopeIndex fills its positions after this call, in the storage handed on here. The forward's one-row
    # THD branch reads no attention mask (it sets none for the language model).
    flat = {"input_ids": input_ids.reshape(1, -1), "position_ids": positions.reshape(3, 1, -1), "attention_mask": None}
    return {**kwargs, **flat}


class FlatPackedRows:
    """Mixin for Bridge's ``Qwen3VLModel``: the step's packed rows handed to its forward flat
    (:func:`flat_step_rows`; see the module docstring)."""

    #: Micro-batches handed to Bridge's forward flat; what a test asserts is > 0.
    flat_batches: int = 0

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Bridge's forward, given the rows flat where :func:`flat_step_rows` says its packing is the flatten. An
        attention mask must keep every token: :class:`HostRopeIndex`'s pending positions check their host copy of it
        when they fill (a mask that drops tokens raises there, before the language model runs); without them the
        rows are left to Bridge."""
        flat = None if args else flat_step_rows(self, kwargs)
        if flat is not None and kwargs.get("attention_mask") is not None:
            pending = self.__dict__.get(_PENDING)
            if pending is None or pending.attention_mask is None:
                flat = None
            else:
                pending.require_unpadded_rows()
        if flat is None:
            return super().forward(*args, **kwargs)
        self.flat_batches += 1
        return super().forward(**flat)


class BoundGrids:
    """Mixin for Bridge's ``Qwen3VLModel``: the micro-batch's published host grids bound to this call's grid arguments
    while it runs (:func:`bridge_cudagraph.vision.host_grids.bind`; see the module docstring)."""

    #: Forwards that bound at least one host grid; what a test asserts is > 0.
    grid_binds: int = 0

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if args or not host_grids.bind(kwargs):
            return super().forward(*args, **kwargs)
        self.grid_binds += 1
        try:
            return super().forward(*args, **kwargs)
        finally:
            host_grids.unbind()


class IndexedDeepstack:
    """Mixin for Bridge's ``Qwen3VLTransformerBlock``: the deepstack merge by row positions (see the module
    docstring). Bridge's method, for comparison::

        hidden_states = hidden_states.transpose(0, 1).contiguous()
        local_this = hidden_states[visual_pos_masks, :].clone() + visual_embeds
        hidden_states[visual_pos_masks, :] = local_this
        hidden_states = hidden_states.transpose(0, 1).contiguous()
    """

    def _deepstack_process(
        self, hidden_states: torch.Tensor, visual_pos_masks: torch.Tensor, visual_embeds: torch.Tensor
    ) -> torch.Tensor:
        rows = visual_embeds.shape[0]
        mask = visual_pos_masks.to(hidden_states.device)
        # Beyond ``rows`` positions nonzero_static would drop rows, below it pad with -1: either would move the
        # embeddings silently, where Bridge's boolean indexing raises.
        torch._assert_async(mask.sum() == rows)
        batch, position = torch.nonzero_static(mask, size=rows).unbind(1)
        hidden_states = hidden_states.transpose(0, 1).contiguous()
        local_this = hidden_states[batch, position].clone() + visual_embeds
        hidden_states[batch, position] = local_this
        return hidden_states.transpose(0, 1).contiguous()


def _merge_by_rows(target: Any, index: Any, value: Any) -> bool:
    """``target[index] = value`` written at ``index``'s positions, where ``value`` is a :class:`VisionRows` and
    ``index`` a boolean mask over ``target``'s leading dimensions that selects one row of ``value`` per True; False
    (nothing written) for any other assignment."""
    lead = index.dim() if isinstance(index, torch.Tensor) else -1
    if not (
        lead > 0
        and isinstance(value, VisionRows)
        and index.dtype == torch.bool
        and isinstance(target, torch.Tensor)
        and index.device == target.device
        and value.dim() >= 1
        and tuple(index.shape) == tuple(target.shape[:lead])
        and tuple(value.shape[1:]) == tuple(target.shape[lead:])
    ):
        return False
    rows = value.shape[0]
    # Bridge's boolean index raises on a count mismatch; nonzero_static would drop or repeat rows silently.
    torch._assert_async(index.sum() == rows)
    target.index_put_(torch.nonzero_static(index, size=rows).unbind(1), value)
    owner = value.owner() if value.owner is not None else None
    if owner is not None:
        owner.row_merges += 1
    return True


class VisionRows(torch.Tensor):
    """The vision encoder's output as Bridge's forward receives it under :class:`RowMerge`: the same tensor
    (``as_subclass``: its storage and autograd history) but for one thing, how a boolean mask writes it.

    ``target[mask] = rows`` is ``target.index_put_(positions, rows)``, the positions found with ``nonzero_static``
    (size ``len(rows)``) where torch finds them with ``nonzero``, which waits. Every other operation runs on the plain
    tensor and returns plain tensors, so the type ends at the merge."""

    #: The model whose :attr:`RowMerge.row_merges` counts this tensor's merge (a weak reference; set by the hook).
    owner: weakref.ref | None = None

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        with torch._C.DisableTorchFunctionSubclass():
            if func is torch.Tensor.__setitem__ and not kwargs and len(args) == 3 and _merge_by_rows(*args):
                return None
            return func(*args, **(kwargs or {}))


class RowMerge:
    """Mixin for Bridge's ``Qwen3VLModel`` on the first pipeline stage: its vision encoder's output reaches the
    image-token merge as :class:`VisionRows` (a forward hook, put on by :func:`install`; see the module docstring)."""

    #: Image-token merges written by row positions; what a test asserts is > 0.
    row_merges: int = 0


#: The instance-dict key of each mixin's hook handle, and of its call counter (a class attribute of the mixin, set on
#: the instance at the first count).
_HOOKS: dict[type, str] = {HostRopeIndex: _EMBEDDING_HOOK, RowMerge: _VISION_HOOK}
_COUNTERS: dict[type, str] = {
    HostRopeIndex: "host_positions_calls",
    RowMerge: "row_merges",
    FlatPackedRows: "flat_batches",
    BoundGrids: "grid_binds",
}


def _vision_rows(model_ref: weakref.ref) -> Callable[..., Any]:
    def hook(module: Any, args: Any, output: Any) -> Any:
        if model_ref() is None or not isinstance(output, tuple) or not output:
            return None
        if not isinstance(output[0], torch.Tensor):
            return None
        rows = output[0].as_subclass(VisionRows)
        rows.owner = model_ref
        return (rows, *output[1:])

    return hook


def _targets(model_chunks: list[Any]) -> list[tuple[Any, type]]:
    """``(object, mixin)`` for every Bridge ``Qwen3VLModel`` in ``model_chunks`` and its language decoder."""
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.model import Qwen3VLModel
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.transformer_block import Qwen3VLTransformerBlock

    out: list[tuple[Any, type]] = []
    for chunk in model_chunks:
        for module in chunk.modules():
            if isinstance(module, Qwen3VLModel):
                # Installed in this order: HostRopeIndex in front of FlatPackedRows, so the positions are derived
                # from the rows; BoundGrids in front of both, so the positions read the bound grids.
                out.append((module, FlatPackedRows))
                out.append((module, HostRopeIndex))
                out.append((module, BoundGrids))
                if getattr(module, "pre_process", False) and getattr(module, "vision_model", None) is not None:
                    out.append((module, RowMerge))
                decoder = getattr(module.language_model, "decoder", None)
                if isinstance(decoder, Qwen3VLTransformerBlock):
                    out.append((decoder, IndexedDeepstack))
    return out


#: Each part of ``model.cuda_graph.forward``: the mixins :func:`install` puts on for it.
MECHANISMS: dict[str, tuple[type, ...]] = {
    "positions": (HostRopeIndex,),
    "merges": (IndexedDeepstack, RowMerge),
    "flat_rows": (FlatPackedRows,),
    "collated_grids": (BoundGrids,),
}


def install(model_chunks: list[Any], mechanisms: Iterable[str] = tuple(MECHANISMS)) -> list[tuple[Any, type]]:
    """Put the mixins of ``mechanisms`` (:data:`MECHANISMS`) on the Qwen3-VL models in ``model_chunks``; returns what
    :func:`uninstall` takes off (empty for other models, and where the installed Bridge is not the release they
    mirror, logged once)."""
    if not compat.qwen3_vl_forward_is_mirrored():
        logger.warning(
            "bridge_cudagraph: model.cuda_graph.forward is off: it mirrors Megatron-Bridge %s's Qwen3-VL forward "
            "(installed: %s)",
            compat.QWEN3_VL_FORWARD_MIRRORS,
            compat.installed_version("megatron-bridge"),
        )
        return []
    wanted = {mixin for name in mechanisms for mixin in MECHANISMS[name]}
    mixed_in = [(obj, mixin) for obj, mixin in _targets(model_chunks) if mixin in wanted]
    for obj, mixin in mixed_in:
        extend_instance_class(obj, mixin)
        embedding = getattr(getattr(obj, "language_model", None), "embedding", None)
        if mixin is HostRopeIndex and getattr(obj, "pre_process", False) and embedding is not None:
            obj.__dict__[_EMBEDDING_HOOK] = embedding.register_forward_pre_hook(_fill_pending(weakref.ref(obj)))
        if mixin is RowMerge:
            obj.__dict__[_VISION_HOOK] = obj.vision_model.register_forward_hook(_vision_rows(weakref.ref(obj)))
    return mixed_in


def uninstall(mixed_in: list[tuple[Any, type]]) -> None:
    """Undo :func:`install` for the pairs in ``mixed_in``: the host classes back, their counters and hooks dropped (a
    pair's own only: the benchmark takes :class:`RowMerge` off alone)."""
    for obj, mixin in mixed_in:
        restore_instance_class(obj, mixin)
        obj.__dict__.pop(_COUNTERS.get(mixin, ""), None)
        if mixin is HostRopeIndex:
            obj.__dict__.pop(_PENDING, None)
        handle = obj.__dict__.pop(_HOOKS.get(mixin, ""), None)
        if handle is not None:
            handle.remove()


def _count(model_chunks: list[Any], mixin: type) -> int:
    """``mixin``'s call counter summed over its objects in ``model_chunks`` (:func:`counts_in`)."""
    return counts_in(model_chunks)[_COUNTERS[mixin]]


def host_positions_calls(model_chunks: list[Any]) -> int:
    """Micro-batches whose positions came from the host copy, over the Qwen3-VL models in ``model_chunks``."""
    return _count(model_chunks, HostRopeIndex)


def row_merges(model_chunks: list[Any]) -> int:
    """Image-token merges written by row positions (:class:`RowMerge`) over the Qwen3-VL models in ``model_chunks``."""
    return _count(model_chunks, RowMerge)


def counts(mixed_in: list[tuple[Any, type]]) -> dict[str, int]:
    """What each counted mixin of ``mixed_in`` (:func:`install`'s pairs) did so far: ``host_positions_calls``,
    ``row_merges``, ``flat_batches``; each object counted once per mixin (one model carries several), 0 once
    :func:`uninstall` dropped the counters."""
    return {
        name: sum(obj.__dict__.get(name, 0) for obj, on in mixed_in if on is mixin)
        for mixin, name in _COUNTERS.items()
    }


def counts_in(model_chunks: list[Any]) -> dict[str, int]:
    """:func:`counts` over the Qwen3-VL models in ``model_chunks``."""
    return counts(_targets(model_chunks))


def flat_batches(model_chunks: list[Any]) -> int:
    """Micro-batches handed to Bridge's forward flat (:class:`FlatPackedRows`) over the Qwen3-VL models in
    ``model_chunks``."""
    return _count(model_chunks, FlatPackedRows)


def grid_binds(model_chunks: list[Any]) -> int:
    """Forwards that read their grids from the collate's host copies (:class:`BoundGrids`) over the Qwen3-VL models in
    ``model_chunks``."""
    return _count(model_chunks, BoundGrids)


def installed(model_chunks: list[Any]) -> bool:
    """Whether :func:`install` has put a mixin on some object inside ``model_chunks``."""
    return any(isinstance(obj, mixin) for obj, mixin in _targets(model_chunks))
