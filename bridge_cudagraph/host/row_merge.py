"""Qwen3-VL's deepstack and image-token merges by row positions instead of boolean masks, what
``model.cuda_graph.forward.merges`` switches: :class:`IndexedDeepstack` and :class:`RowMerge` (with
:class:`VisionRows`).

Host change:
  changes: the class of one ``Qwen3VLModel``'s language decoder (:class:`IndexedDeepstack` in front); the class of
    one ``Qwen3VLModel`` on the first pipeline stage (:class:`RowMerge`, a marker) and a forward hook on its vision
    encoder (:func:`vision_rows_hook`) that hands the encoder's output on as :class:`VisionRows`
  written for: Megatron-Bridge 0.6.2 ``Qwen3VLModel.forward`` (its image-token merge), ``_deepstack_process``
  gate: as :mod:`~bridge_cudagraph.host.forward`, which installs them; ``model.cuda_graph.forward.merges``
  undo: :func:`~bridge_cudagraph.host.forward.uninstall`

Both write the same values, bitwise, as Bridge's boolean indexing, at positions ``nonzero_static`` finds without a
wait (the count asserted on the device), where Bridge's ``nonzero`` waits for the GPU.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from bridge_cudagraph.host.forward_counts import ForwardCounts

__all__ = ["IndexedDeepstack", "RowMerge", "VisionRows", "vision_rows_hook"]


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
    if value.counts is not None:
        value.counts.row_merges += 1
    return True


class VisionRows(torch.Tensor):
    """The vision encoder's output as Bridge's forward receives it under :class:`RowMerge`: the same tensor
    (``as_subclass``: its storage and autograd history) but for one thing, how a boolean mask writes it.

    ``target[mask] = rows`` is ``target.index_put_(positions, rows)``, the positions found with ``nonzero_static``
    (size ``len(rows)``) where torch finds them with ``nonzero``, which waits. Every other operation runs on the plain
    tensor and returns plain tensors, so the type ends at the merge."""

    #: The install's counts that this tensor's merge counts into (set by the hook).
    counts: ForwardCounts | None = None

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        with torch._C.DisableTorchFunctionSubclass():
            if func is torch.Tensor.__setitem__ and not kwargs and len(args) == 3 and _merge_by_rows(*args):
                return None
            return func(*args, **(kwargs or {}))


class RowMerge:
    """Mixin for Bridge's ``Qwen3VLModel`` on the first pipeline stage: marks the model whose vision encoder's output
    reaches the image-token merge as :class:`VisionRows` (the hook :func:`vision_rows_hook`, put on with it)."""


def vision_rows_hook(model_ref: weakref.ref, counts: ForwardCounts) -> Callable[..., Any]:
    """The vision encoder's forward hook: its output handed on as :class:`VisionRows`, counting into ``counts``."""

    def hook(module: Any, args: Any, output: Any) -> Any:
        if model_ref() is None or not isinstance(output, tuple) or not output:
            return None
        if not isinstance(output[0], torch.Tensor):
            return None
        rows = output[0].as_subclass(VisionRows)
        rows.counts = counts
        return (rows, *output[1:])

    return hook
