"""Qwen3-VL's forward with fewer host waits: what ``model.cuda_graph.fewer_host_waits`` switches (null: on wherever
graphs are on a Qwen3-VL model).

Bridge 0.6.2's ``Qwen3VLModel.forward`` makes the host wait for the GPU about 20 times per micro-batch (run 42's
profile at the 2B shape: 21 waits in the forward, 11 in the backward, 35 in the step). Each wait drains the queue the
graphs keep full, and the GPU then idles while the host catches up:

* the mRoPE positions: Bridge's ``get_rope_index`` reads the GPU's tokens and image grids element by element
  (``.item()``, ``.tolist()``, boolean indexing: 30 waits for two samples holding five images, run 43).
  :class:`HostRopeIndex` enqueues host copies of the tokens, grids and sequence offsets at the forward's start,
  hands Bridge's forward an empty ``position_ids`` of the shape it accepts as explicit mRoPE positions
  ([3, batch, sequence]), and fills it just before the input embedding runs (:class:`PendingPositions`): Bridge's
  own ``get_rope_index`` on the host copies, uploaded from pinned memory. By then the vision encoder's work is
  queued, so the host waits for the copies only (an event) while the GPU keeps running. Integer arithmetic on the
  same integers: the positions are equal, so is the step.
* the deepstack merge: Bridge's ``_deepstack_process`` gathers and scatters the visual rows of the hidden states
  with a boolean mask, which waits (``nonzero``) 6 times per merge, forward and backward, in each of the three
  deepstack layers. :class:`IndexedDeepstack` gathers and scatters the same rows by their positions, found with
  ``nonzero_static`` (its size is the number of visual rows, known on the host): no wait; the device asserts that
  the mask holds exactly that many rows. The same rows, the same additions, the same gradients.

Both are mixins put on one model's objects by :func:`install` (:func:`~bridge_cudagraph.host_patches.
extend_instance_class`; the model's instance dict gets a call counter and the embedding hook's handle, nothing the
host saves or reads) and taken off by :func:`uninstall`; the callback and the benchmark call them through
:mod:`bridge_cudagraph.step_host`. They mirror Bridge 0.6's forward (:func:`bridge_cudagraph.compat.
qwen3_vl_forward_is_mirrored`); on another release nothing is installed. The image-token merge
(``combined_embeddings[vision_mask] = vision_embeds``: one wait forward, two backward) sits inside Bridge's forward
and stays. At the 2B shape a step waits 7 times instead of 35 (run 43).
"""

from __future__ import annotations

import copy
import logging
import weakref
from collections.abc import Callable
from typing import Any

import torch

from bridge_cudagraph import compat
from bridge_cudagraph.host_patches import extend_instance_class, restore_instance_class

__all__ = [
    "HostRopeIndex",
    "IndexedDeepstack",
    "PendingPositions",
    "host_positions_calls",
    "install",
    "installed",
    "rope_positions",
    "uninstall",
]

logger = logging.getLogger(__name__)

#: The ``PackedSeqParams`` fields Bridge's ``get_rope_index`` reads on the host (``_get_flat_packed_ranges``,
#: ``get_packed_seq_attention_mask``).
_PACKED_OFFSETS = ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded")


def _to_host(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """A pinned host copy, enqueued without waiting (the caller waits on an event recorded after its copies)."""
    if tensor is None or not tensor.is_cuda:
        return tensor
    return tensor.to("cpu", non_blocking=True)


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
            return super().forward(*args, **kwargs)
        self.__dict__[_PENDING] = pending
        try:
            output = super().forward(*args, **kwargs)
        finally:
            self.__dict__.pop(_PENDING, None)
        if not pending.filled:
            raise RuntimeError(
                "bridge_cudagraph: Qwen3-VL's forward read no input embedding, so its mRoPE positions were never "
                "filled; set model.cuda_graph.fewer_host_waits=false"
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


#: Instance-dict keys of a model with :class:`HostRopeIndex`: the embedding's pre-hook handle, the pending positions.
_EMBEDDING_HOOK = "_bridge_cudagraph_positions_hook"
_PENDING = "_bridge_cudagraph_pending_positions"


def _fill_pending(model_ref: weakref.ref) -> Callable[..., None]:
    def hook(module: Any, args: Any) -> None:
        model = model_ref()
        pending = None if model is None else model.__dict__.pop(_PENDING, None)
        if pending is not None:
            pending.fill()

    return hook


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


def _targets(model_chunks: list[Any]) -> list[tuple[Any, type]]:
    """``(object, mixin)`` for every Bridge ``Qwen3VLModel`` in ``model_chunks`` and its language decoder."""
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.model import Qwen3VLModel
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.transformer_block import Qwen3VLTransformerBlock

    out: list[tuple[Any, type]] = []
    for chunk in model_chunks:
        for module in chunk.modules():
            if isinstance(module, Qwen3VLModel):
                out.append((module, HostRopeIndex))
                decoder = getattr(module.language_model, "decoder", None)
                if isinstance(decoder, Qwen3VLTransformerBlock):
                    out.append((decoder, IndexedDeepstack))
    return out


def install(model_chunks: list[Any]) -> list[tuple[Any, type]]:
    """Put the mixins on the Qwen3-VL models in ``model_chunks``; returns what :func:`uninstall` takes off (empty for
    other models, and where the installed Bridge is not the release they mirror, logged once)."""
    if not compat.qwen3_vl_forward_is_mirrored():
        logger.warning(
            "bridge_cudagraph: fewer_host_waits is off: it mirrors Megatron-Bridge %s's Qwen3-VL forward "
            "(installed: %s)",
            compat.QWEN3_VL_FORWARD_MIRRORS,
            compat.installed_version("megatron-bridge"),
        )
        return []
    done = _targets(model_chunks)
    for obj, mixin in done:
        extend_instance_class(obj, mixin)
        embedding = getattr(getattr(obj, "language_model", None), "embedding", None)
        if mixin is HostRopeIndex and getattr(obj, "pre_process", False) and embedding is not None:
            obj.__dict__[_EMBEDDING_HOOK] = embedding.register_forward_pre_hook(_fill_pending(weakref.ref(obj)))
    return done


def uninstall(done: list[tuple[Any, type]]) -> None:
    """Undo :func:`install`: the host classes back, the counter dropped."""
    for obj, mixin in done:
        restore_instance_class(obj, mixin)
        obj.__dict__.pop("host_positions_calls", None)
        obj.__dict__.pop(_PENDING, None)
        handle = obj.__dict__.pop(_EMBEDDING_HOOK, None)
        if handle is not None:
            handle.remove()


def host_positions_calls(model_chunks: list[Any]) -> int:
    """Micro-batches whose positions came from the host copy, over the Qwen3-VL models in ``model_chunks`` (0 once
    :func:`uninstall` dropped the counters)."""
    return sum(obj.__dict__.get("host_positions_calls", 0) for obj, mixin in _targets(model_chunks))


def installed(model_chunks: list[Any]) -> bool:
    """Whether :func:`install` has put a mixin on some object inside ``model_chunks``."""
    return any(isinstance(obj, mixin) for obj, mixin in _targets(model_chunks))
