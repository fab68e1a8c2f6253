"""The decoder's forward on the ladder's language graphs: one replay path for packed (THD) and padded (BSHD) rows.

:func:`install_ladder_replay` gives a decoder instance (megatron-core's ``TransformerBlock``, Bridge's
``Qwen3VLTransformerBlock``) a subclass of its own class (:class:`LadderReplayBlock`) whose ``forward`` hands a plain
training call to the language helper of the ladder (:class:`~bridge_cudagraph.capture.packed.PackedLanguageGraphHelper`
or :class:`~bridge_cudagraph.capture.padded.PaddedLanguageGraphHelper`). The helper replays the micro-batch, or answers
None (another form, before capture, or a micro-batch that does not fit: counted) and the host's ``forward`` runs
unchanged. Evaluation, inference and calls with arguments the graphs do not take are the host's.

:func:`replay_segments` is the layer loop on a rung's graphs, written once for both language forms and the vision
encoder; what follows a segment (the language decoder's deepstack merge, :func:`deepstack_merge`, or the encoder's
deepstack merger) is the caller's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol

import torch

from bridge_cudagraph.host.instance_class import HostMixin

__all__ = [
    "LadderReplayBlock",
    "deepstack_merge",
    "install_ladder_replay",
    "remove_ladder_replay",
    "replay_segments",
]

#: Arguments of the decoder's forward that the graphs do not take: a call that sets any of them is the host's.
_UNGRAPHED_ARGUMENTS = (
    "context",
    "context_mask",
    "rotary_pos_cos",
    "rotary_pos_sin",
    "rotary_pos_cos_sin",
    "attention_bias",
    "sequence_len_offset",
    "padding_mask",
    "extract_layer_indices",
    "inference_context",
    "inference_params",
)


class BlockReplay(Protocol):
    """What :class:`LadderReplayBlock` asks of the ladder's language helper."""

    tight: bool

    def forward_block(self, block: Any, hidden_states: torch.Tensor, attention_mask: Any, kwargs: dict) -> Any:
        """The decoder's output on the graphs, or None: the host's forward runs."""


class LadderReplayBlock(HostMixin):
    """Mixin put in front of a decoder's class (:func:`install_ladder_replay`): a plain training call goes to the
    helper first; every other call, and every call the helper declines, is the host's ``forward`` unchanged."""

    ladder_helper: BlockReplay | None = None

    def forward(self, hidden_states, attention_mask=None, *args, **kwargs):
        helper = self.ladder_helper
        if helper is not None and self.training and not args:
            if not any(kwargs.get(name) is not None for name in _UNGRAPHED_ARGUMENTS):
                out = helper.forward_block(self, hidden_states, attention_mask, kwargs)
                if out is not None:
                    return out
        return super().forward(hidden_states, attention_mask, *args, **kwargs)


def install_ladder_replay(decoder: torch.nn.Module, helper: BlockReplay | None) -> None:
    """Give ``decoder`` (a ``TransformerBlock`` instance) the ladder's replay; undone by :func:`remove_ladder_replay`.

    Patches the instance's class, not the host's (:func:`~bridge_cudagraph.host.instance_class.extend_instance_class`).
    """
    from bridge_cudagraph.host.instance_class import extend_instance_class

    extend_instance_class(decoder, LadderReplayBlock)
    decoder.ladder_helper = helper  # type: ignore[assignment]  # Module.__setattr__ is typed for tensors/modules


def remove_ladder_replay(decoder: torch.nn.Module) -> None:
    """Restore the decoder's own class."""
    from bridge_cudagraph.host.instance_class import restore_instance_class

    decoder.__dict__.pop("ladder_helper", None)
    restore_instance_class(decoder, LadderReplayBlock)


def replay_segments(
    block, layers, h, statics, segments, *, after_segment: Callable[[int, torch.Tensor], torch.Tensor] | None = None
) -> torch.Tensor:
    """A block's layer loop on one rung's graphs (``layers``, one per segment of ``segments``), the one loop of every
    replay (the language decoder's, :meth:`~bridge_cudagraph.capture.vision.VisionGraphHelper.replay_encoder`'s), as
    the host's ``TransformerBlock.forward`` (megatron-core 0.19.2) runs it: each run of layers' manual hooks (parameter
    gathers), its graph on ``(h, *statics)``, then ``after_segment(end, h)`` where given (what follows the segment
    ending before layer ``end``: a deepstack merge, :func:`deepstack_merge`; before it, after a packed MoE layer's
    graph, that layer's eager MLP half,
    :attr:`~bridge_cudagraph.capture.language_ladder.LanguageLadder.segment_remainder`), whose result goes on; under
    sequence parallelism inside the tensor-parallel RNG fork, as the host's block (and the capture)."""
    from megatron.core import tensor_parallel

    parallel = block.config.sequence_parallel
    rng = tensor_parallel.get_cuda_rng_tracker().fork() if parallel else contextlib.nullcontext()
    with rng:
        for (start, end), graph in zip(segments, layers, strict=True):
            for layer in block.layers[start:end]:
                for hook, hook_args in getattr(layer, "cuda_graph_manual_hooks", []):
                    hook(*hook_args)
            h = graph(h, *statics)
            if after_segment is not None:
                h = after_segment(end, h)
    return h


def deepstack_merge(block, merges: int, visual, deepstack) -> Callable[[int, torch.Tensor], torch.Tensor]:
    """What follows a language segment (:func:`replay_segments`' ``after_segment``): after layer ``i < merges``, the
    micro-batch's ``i``-th deepstack feature merged at the ``visual`` rows, eagerly, with the host's own
    ``_deepstack_process`` (Bridge 0.6.2's ``Qwen3VLTransformerBlock.forward``)."""
    from megatron.core.utils import make_viewless_tensor

    from bridge_cudagraph.host.compat import deepstack_process

    def merge(end: int, h: torch.Tensor) -> torch.Tensor:
        if end - 1 >= merges:
            return h
        h = deepstack_process(block, h, visual, deepstack[end - 1])
        return make_viewless_tensor(inp=h, requires_grad=h.requires_grad, keep_graph=True)

    return merge


def check_merges(merges: int, segments) -> None:
    """A deepstack merge must follow a segment's last layer: the graphs were cut for the plan's merges."""
    if not set(range(merges)) <= {end - 1 for _, end in segments}:
        raise RuntimeError(
            f"bridge_cudagraph: this micro-batch merges {merges} deepstack features, but the language graphs span "
            f"layers {list(segments)} (captured for the plan's deepstack merges); the plan and the model disagree"
        )
