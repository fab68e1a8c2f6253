"""The decoder's forward on the ladder's language graphs: one replay path for packed (THD) and padded (BSHD) rows.

:func:`install_ladder_replay` gives a decoder instance (megatron-core's ``TransformerBlock``, Bridge's
``Qwen3VLTransformerBlock``) a subclass of its own class (:class:`LadderReplayBlock`) whose ``forward`` hands a plain
training call to the language helper of the ladder (:class:`~bridge_cudagraph.capture.packed.PackedLanguageGraphHelper`
or :class:`~bridge_cudagraph.capture.padded.PaddedLanguageGraphHelper`). The helper replays the micro-batch, or answers
None (another form, before capture, or a micro-batch that does not fit: counted) and the host's ``forward`` runs
unchanged. Evaluation, inference and calls with arguments the graphs do not take are the host's.

:func:`replay_segments` is the decoder's layer loop on a rung's graphs, written once for both forms.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

import torch

__all__ = ["LadderReplayBlock", "install_ladder_replay", "remove_ladder_replay", "replay_segments"]

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


class LadderReplayBlock:
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

    Patches the instance's class, not the host's (:func:`~bridge_cudagraph.host.patches.extend_instance_class`).
    """
    from bridge_cudagraph.host.instance_class import extend_instance_class

    extend_instance_class(decoder, LadderReplayBlock)
    decoder.ladder_helper = helper


def remove_ladder_replay(decoder: torch.nn.Module) -> None:
    """Restore the decoder's own class."""
    from bridge_cudagraph.host.instance_class import restore_instance_class

    decoder.__dict__.pop("ladder_helper", None)
    restore_instance_class(decoder, LadderReplayBlock)


def replay_segments(block, layers, h, statics, segments, *, merges: int, visual, deepstack) -> torch.Tensor:
    """The decoder's layer loop on one rung's graphs (``layers``, one per segment), as the host's
    ``TransformerBlock.forward`` (megatron-core 0.19.2) and Bridge 0.6.2's ``Qwen3VLTransformerBlock.forward`` run it:
    each run of layers' manual hooks (parameter gathers), its graph, then the deepstack merge that follows it
    (eagerly, the host's own ``_deepstack_process``); under sequence parallelism inside the tensor-parallel RNG fork,
    as the host's block."""
    from megatron.core import tensor_parallel
    from megatron.core.utils import make_viewless_tensor

    from bridge_cudagraph.host.compat import deepstack_process

    parallel = block.config.sequence_parallel
    rng = tensor_parallel.get_cuda_rng_tracker().fork() if parallel else contextlib.nullcontext()
    with rng:
        for (start, end), graph in zip(segments, layers, strict=True):
            for layer in block.layers[start:end]:
                for hook, hook_args in getattr(layer, "cuda_graph_manual_hooks", []):
                    hook(*hook_args)
            h = graph(h, *statics)
            if end - 1 < merges:
                h = deepstack_process(block, h, visual, deepstack[end - 1])
                h = make_viewless_tensor(inp=h, requires_grad=h.requires_grad, keep_graph=True)
    return h


def check_merges(merges: int, segments) -> None:
    """A deepstack merge must follow a segment's last layer: the graphs were cut for the plan's merges."""
    if not set(range(merges)) <= {end - 1 for _, end in segments}:
        raise RuntimeError(
            f"bridge_cudagraph: this micro-batch merges {merges} deepstack features, but the language graphs span "
            f"layers {list(segments)} (captured for the plan's deepstack merges); the plan and the model disagree"
        )
