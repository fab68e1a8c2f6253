"""The collate's CPU grids bound to the device grids one Qwen3-VL forward receives (:class:`BoundGrids`), what
``model.cuda_graph.forward.collated_grids`` switches.

Host change:
  changes: the class of one ``Qwen3VLModel`` (:class:`BoundGrids` in front of the other mixins of
    :mod:`~bridge_cudagraph.host.forward`); while one forward runs, the micro-batch's CPU grids bound to its grid
    arguments (:func:`bridge_cudagraph.vision.cpu_grids.bind`), checked on the device
  written for: Megatron-Bridge 0.6.2 ``Qwen3VLModel.forward`` (its ``image_grid_thw`` and ``video_grid_thw``)
  gate: as :mod:`~bridge_cudagraph.host.forward`, which installs it; ``model.cuda_graph.forward.collated_grids``
  undo: :func:`~bridge_cudagraph.host.forward.uninstall`

In front of the others, so the positions (:mod:`~bridge_cudagraph.host.rope_index`) and the vision encoder's replay
read the bound CPU copies instead of reading the grids back from the GPU.
"""

from __future__ import annotations

from typing import Any

from bridge_cudagraph.host.forward_counts import counts_of
from bridge_cudagraph.host.instance_class import HostMixin
from bridge_cudagraph.micro_batch import within_micro_batch
from bridge_cudagraph.vision import cpu_grids

__all__ = ["BoundGrids"]


class BoundGrids(HostMixin):
    """Mixin for Bridge's ``Qwen3VLModel``: the micro-batch's CPU grids bound to this call's grid arguments while it
    runs (see the module docstring)."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if args:
            return super().forward(*args, **kwargs)
        with within_micro_batch() as micro_batch:
            if not cpu_grids.bind(micro_batch, kwargs):
                return super().forward(*args, **kwargs)
            counts = counts_of(self)
            if counts is not None:
                counts.grid_binds += 1
            try:
                return super().forward(*args, **kwargs)
            finally:
                micro_batch.bound_grids = ()
