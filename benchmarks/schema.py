"""What ``bench.json`` holds, shared by its writers (:mod:`benchmarks.bench`, :mod:`benchmarks.bench_gpus`) and its
reader (:mod:`benchmarks.bench_report`): the variant names, the statuses of a configuration and of a variant, how
values are made JSON-safe, and the command recorded in ``meta``.

Layout: ``{"meta": {...}, "configs": [{"name", "status", ...configs.BenchConfig.as_dict(), "variants": {name:
record}, "paired": {...}}]}``; a variant's record has ``status`` (:data:`OK`, or :data:`FAILED` with ``error`` and,
where found, the root ``cause`` and ``where`` it came from, or :data:`REFUSED` with ``error`` the reason), its step
times, losses and grad norms, and its differences from eager (``loss_max_abs_diff_vs_eager``, None when either run
had a non-finite loss: then the record is failed, see :func:`benchmarks.bench.compare_steps`).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

#: The reference: graphs off.
EAGER = "eager"
#: The run-to-run control: eager trained a second time, exactly like ``eager``.
CONTROL = "eager_repeat"
#: Variants without graphs (no capture time, no graph memory).
UNGRAPHED = (EAGER, CONTROL)
#: ``model.cuda_graph.forward`` with every part Bridge's own (what ``fewer_host_waits: false`` was).
BRIDGE_FORWARD = {"positions": False, "merges": False, "flat_rows": False, "collated_grids": False}
#: Ours and the speed levers of issue #18, each measured against it: variant -> what it changes from the product's
#: defaults (``ours``: vision graphs cut after each deepstack layer, the optimizer stepping eagerly with its
#: per-parameter host work cached).
OURS_VARIANTS: dict[str, dict[str, Any]] = {
    "ours": {},
    # The first version's vision graphs: one per layer per budget.
    "ours_per_layer": {"vision_graph_unit": "layer"},
    # Bridge's optimizer graph on top (optimizer.optimizer_cuda_graph=true: capturable FusedAdam + megatron-core's
    # OptimizerCudaGraphWrapper), opt-in: its kernel rounds 1-2 ulps from the default one.
    "ours_optgraph": {"optimizer_graph": True},
    # megatron-core's optimizer step and gradient finalisation as they are (model.cuda_graph.cached_walks: both
    # false): what doing their walks once gives.
    "ours_plain_optimizer": {"cached_walks": {"optimizer": False, "grad_finalize": False}},
    # Bridge's per-micro-batch derivation of the vision position indices, weights and rotary rows
    # (GraphedQwen3VLVisionModel.position_cache_size = 0): what the per-image-size cache gives.
    "ours_uncached_positions": {"vision_position_cache": False},
    # megatron-core's module walk at the end of finalize_model_grads on every step
    # (model.cuda_graph.cached_walks.grad_finalize=false): what listing its modules once gives.
    "ours_walking_finalize": {"cached_walks": {"grad_finalize": False}},
    # Bridge's default model.gradient_accumulation_fusion=true, which this stack (no APEX) builds only through this
    # plugin's provider (bridge_cudagraph.host.wgrad_fusion): TE's layers sum weight gradients into main_grad in their
    # GEMMs. It changes the gradients' rounding, so its drift from the unfused eager run is not noise alone.
    "ours_fused": {"gradient_accumulation_fusion": True},
    # Bridge's Qwen3-VL forward as it is (model.cuda_graph.forward: every part false): ~20 host waits per micro-batch
    # in get_rope_index and the deepstack merge; what bridge_cudagraph.host.forward gives.
    "ours_host_waits": {"forward": BRIDGE_FORWARD},
    # ours_fused with Bridge's forward as it is: the same lever against the fused step.
    "ours_fused_host_waits": {"gradient_accumulation_fusion": True, "forward": BRIDGE_FORWARD},
    # ours_fused with one language graph per layer (model.cuda_graph.language.graph_unit=layer, megatron-core's unit)
    # instead of one per run of layers between deepstack merges: what the runs give.
    "ours_fused_layer_graphs": {"gradient_accumulation_fusion": True, "language_graph_unit": "layer"},
    # ours_fused with Bridge's image-token merge through the boolean mask (model.cuda_graph.forward without
    # bridge_cudagraph.host.row_merge.RowMerge): one wait forward, two backward; what the row merge gives.
    "ours_fused_merge_waits": {"gradient_accumulation_fusion": True, "forward_off": ("RowMerge",)},
    # Bridge's forward packing the step's packed rows itself (model.cuda_graph.forward without
    # bridge_cudagraph.host.flat_rows.FlatPackedRows): preprocess_packed_seqs and the deepstack round trip, with
    # their waits; what handing it the rows flat gives. Only packed micro-batches differ.
    "ours_bridge_packing": {"forward_off": ("FlatPackedRows",)},
    # The vision grid read back from the GPU (model.cuda_graph.forward without
    # bridge_cudagraph.host.bound_grids.BoundGrids): the encoder's replay waits for the queue at every micro-batch;
    # what the collate's CPU copy gives.
    "ours_device_grid": {"forward_off": ("BoundGrids",)},
}
#: megatron-core's one graph over the whole forward and backward (``cuda_graph_impl="full_iteration"``, its
#: ``FullCudaGraphWrapper`` around the schedule as Bridge's ``train()`` installs it): upstream's strongest option, run
#: where ``--variants`` names it (:mod:`benchmarks.full_iteration`).
FULL_ITERATION = "upstream_full_iteration"
#: Variants built on the host's own provider class (Bridge's, no ``cuda_graph`` block).
UPSTREAM_VARIANTS = ("upstream", FULL_ITERATION)
#: Variants whose loss drift is judged against the noise floor.
GRAPHED = (*UPSTREAM_VARIANTS, *OURS_VARIANTS)
#: Every variant, in the order they run: eager first (the reference), the graphed ones, the control last.
VARIANTS = (EAGER, *GRAPHED, CONTROL)

#: A configuration that ran every variant (one still running is ``"running"``; one its process did not finish,
#: ``"incomplete"`` or ``"failed"``).
FINISHED = "complete"
RUNNING = "running"
INCOMPLETE = "incomplete"
#: A variant's (or a configuration's) outcome.
OK = "ok"
FAILED = "failed"
#: A variant that cannot take the configuration's data (``error`` says why); it was never built or timed.
REFUSED = "refused"


def is_ours(variant: str) -> bool:
    """Whether ``variant`` is built by this plugin (``ours`` or one of its levers)."""
    return variant in OURS_VARIANTS


def json_safe(value: Any) -> Any:
    """JSON-safe: NaN/inf floats become None, tuples lists, dict keys strings."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def write_json(path: Path, data: Any) -> None:
    """``data`` (:func:`json_safe`) to ``path`` through a temporary file and a rename: a reader, or a process killed
    while writing, never sees half a file (the benchmarks rewrite their JSON after every variant)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(json_safe(data), indent=2))
    os.replace(tmp, path)


def command_line() -> str:
    """The command that started this process, as a user would type it (``meta["command"]``)."""
    program = sys.argv[0] if sys.argv else ""
    if program.endswith(("bench.py", "-m")):
        program = "python -m benchmarks.bench"
    else:
        program = os.path.basename(program) or "python"
    return " ".join([program, *sys.argv[1:]])
