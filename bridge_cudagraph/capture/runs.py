"""Runs of decoder layers captured as one graph by megatron-core's TE helper (``language.graph_unit: deepstack``).

megatron-core 0.19.2 captures one graph per decoder layer: each training call of a layer goes through
``GraphableMegatronModule.__call__`` to ``_te_cuda_graph_replay`` (argument checks, a zero attention mask built when
the block passes none, the parameter-gather hooks, TE's replay: Python, a graph launch and an autograd node per layer
and micro-batch). On a host-bound step that is most of the language forward's GPU idle time. Between
most layers nothing else runs, so the graph can span them:

* :class:`LayerRun` is the callable the helper captures in place of a run's layers: each layer's own capture body
  (``TransformerLayer._te_cuda_graph_capture``, what the per-layer graph records) one after the other, so the graph
  holds the same kernels in the same order and the layers' outputs are bitwise the per-layer graphs';
* the run's first layer (its *head*) replays the run's graph through megatron-core's own replay path (its
  ``cuda_graphs`` list, its micro-batch index, its argument checks), with the parameter-gather hooks of every layer
  of the run in front (:meth:`LayerRun.setup_manual_hooks`);
* the other layers (*members*) pass their input through while the run replays (:class:`RunMember`, put on those
  layer objects only, :func:`~bridge_cudagraph.host.patches.extend_instance_class`), after checking that it is the
  run's output: a run never spans a point where the decoder changes the hidden states between layers (Qwen3-VL's
  deepstack merges; :func:`~bridge_cudagraph.plan.budgets.layer_segments` cuts there), and if something did, the member
  raises instead of passing on a result computed without it.

Evaluation, inference and a capture in progress take the host's path in every layer, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["LayerRun", "RunMember", "group_runs", "heads_of"]


class LayerRun(torch.nn.Module):
    """Consecutive decoder layers as one graphable callable of megatron-core's TE helper.

    Holds the layers as children (so TE's capture sees their parameters and TE modules) but is not part of the model:
    the model's module tree, parameters and state dict are unchanged. Carries the attributes the helper reads and
    writes on a callable (``cuda_graphs``, ``cuda_graph_manual_hooks``, ``setup_manual_hooks``).
    """

    def __init__(self, layers: Sequence[torch.nn.Module]) -> None:
        super().__init__()
        if len(layers) < 2:
            raise ValueError("a run holds at least two layers; a single layer is its own callable")
        self.layers = torch.nn.ModuleList(layers)
        self.cuda_graphs: list = []
        self.cuda_graph_manual_hooks: list = []
        self._output_key: tuple | None = None

    @property
    def head(self) -> torch.nn.Module:
        """The layer whose replay replays the run."""
        return self.layers[0]

    @property
    def members(self) -> list[torch.nn.Module]:
        """The layers after the head."""
        return list(self.layers)[1:]

    def get_layer_static_inputs(self, seq_length: int, micro_batch_size: int) -> dict:
        """The head's static inputs: every layer of a run reads the same mask and rotary table."""
        return self.head.get_layer_static_inputs(seq_length, micro_batch_size)

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor]:
        for layer in self.layers:
            outputs = layer._te_cuda_graph_capture(hidden_states, **kwargs)
            if len(outputs) != 1:
                raise RuntimeError(
                    f"bridge_cudagraph: decoder layer {layer.layer_number} returns {len(outputs)} outputs under "
                    "capture (cross-attention context or a partial capture); such layers are captured one by one: "
                    "set model.cuda_graph.language.graph_unit=layer"
                )
            (hidden_states,) = outputs
        return (hidden_states,)

    def setup_manual_hooks(self, make_hook) -> None:
        """Every layer's parameter-gather hooks, run by the head before the run's graph replays (the members' own
        replay never runs: they pass through)."""
        hooks = []
        for layer in self.layers:
            layer.setup_manual_hooks(make_hook)
            hooks.extend(layer.cuda_graph_manual_hooks)
            layer.cuda_graph_manual_hooks = []
        self.head.cuda_graph_manual_hooks = hooks
        self.cuda_graph_manual_hooks = hooks

    # ---------------------------------------------------------------------------- replay wiring
    def wire(self) -> None:
        """After capture: the head replays the run's graphs, the members pass through."""
        from bridge_cudagraph.host.patches import extend_instance_class

        self.head.cuda_graphs = [_RunGraph(graph, self) for graph in self.cuda_graphs]
        for member in self.members:
            extend_instance_class(member, RunMember)
            # In the instance dict: set as an attribute, a module would become the member's child (state dict).
            member.__dict__["_bcg_run"] = self

    def unwire(self) -> None:
        """Undo :meth:`wire` (graphs deleted, capture abandoned): every layer its own class and no graphs."""
        from bridge_cudagraph.host.patches import restore_instance_class

        self.head.cuda_graphs = []
        self.head.cuda_graph_manual_hooks = []
        for member in self.members:
            member.__dict__.pop("_bcg_run", None)
            member.cuda_graph_manual_hooks = []
            restore_instance_class(member, RunMember)
        self._output_key = None

    def replaying(self) -> bool:
        """Whether the head's call replays the run now: megatron-core's own condition for it (``__call__``:
        ``_should_call_te_cudagraph`` with graphs present), outside any capture (then every layer computes itself)."""
        from megatron.core.transformer.cuda_graphs import is_graph_capturing

        head = self.head
        return bool(head.cuda_graphs) and not is_graph_capturing() and head._should_call_te_cudagraph()

    def note_output(self, output: torch.Tensor) -> None:
        self._output_key = (output.data_ptr(), tuple(output.shape))

    def check_member_input(self, member: torch.nn.Module, hidden_states: torch.Tensor) -> None:
        """The member's input must be the run's output (the same memory: the decoder's viewless wrapper keeps it)."""
        if self._output_key != (hidden_states.data_ptr(), tuple(hidden_states.shape)):
            first, last = self.head.layer_number, self.layers[-1].layer_number
            raise RuntimeError(
                f"bridge_cudagraph: decoder layer {member.layer_number} is inside the captured run of layers "
                f"{first}-{last}, but its input is not the run's output: the decoder changed the hidden states "
                "between these layers, which the run's graph did not see; set "
                "model.cuda_graph.language.graph_unit=layer"
            )


class _RunGraph:
    """One of a run's graphs as its head's replay calls it: the graph, then the output noted for the members."""

    __slots__ = ("graph", "run")

    def __init__(self, graph, run: LayerRun) -> None:
        self.graph = graph
        self.run = run

    def __call__(self, *args, **kwargs):
        outputs = self.graph(*args, **kwargs)
        self.run.note_output(outputs[0])
        return outputs


class RunMember:
    """Mixin put in front of a run member's class: while its run replays, the layer returns its input (the run's
    output, checked) and the context it was given; any other call is the host's."""

    def __call__(self, *args, **kwargs):
        run = self.__dict__.get("_bcg_run")
        if run is None or not run.replaying():
            return super().__call__(*args, **kwargs)
        hidden_states = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        run.check_member_input(self, hidden_states)
        return hidden_states, kwargs.get("context")


def group_runs(layers: Sequence[torch.nn.Module], segments: Sequence[tuple[int, int]]) -> list[torch.nn.Module]:
    """The callables of one chunk's ``layers`` for ``segments``
    (:func:`~bridge_cudagraph.plan.budgets.layer_segments`): a layer alone where a segment holds one, a
    :class:`LayerRun` where it holds several."""
    covered = [i for start, end in segments for i in range(start, end)]
    if covered != list(range(len(layers))):
        raise ValueError(f"segments {list(segments)} do not cover the {len(layers)} layers once, in order")
    return [layers[start] if end - start == 1 else LayerRun(layers[start:end]) for start, end in segments]


def heads_of(callables: Sequence[torch.nn.Module]) -> list[torch.nn.Module]:
    """Each callable's first layer (a layer is its own)."""
    return [c.head if isinstance(c, LayerRun) else c for c in callables]
