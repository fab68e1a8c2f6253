"""What ``_bridge_runner.py`` records inside Bridge's training loop: a callback that writes the run's JSON after
every step, and the failure the teardown test injects.

It lives apart from the runner because it imports the training stack (torch, Megatron-Bridge, bridge_cudagraph's
callback) at module level, and the runner must not: Bridge's checkpoint save starts megatron-core's write-results
queue, a ``spawn`` multiprocessing Manager, whose child re-imports the launching script as ``__mp_main__``. A runner
that imported the stack at its top made every save pay a second import of the stack (15-27 s on a 2-core host, 20-30 s
with four saves at once), which is what pushed SIGTERM saves past torch 2.11 torchrun's fixed 30 s grace in runs 10,
20 and 21. The runner imports this module inside ``main()``, as ``bridge-cudagraph train`` imports the stack only
inside its verbs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

import torch
from megatron.bridge.training.callbacks import Callback
from megatron.core.utils import get_model_config

from bridge_cudagraph.bridge import loop as bridge_loop
from bridge_cudagraph.bridge.callback import Phase
from bridge_cudagraph.host import (
    finalize as finalize_host,
)
from bridge_cudagraph.host import (
    forward as forward_host,
)
from bridge_cudagraph.host import (
    optimizer as optimizer_host,
)
from bridge_cudagraph.host import (
    wgrad_fusion,
)
from bridge_cudagraph.host.bridge_helper import bridge_helper_installed
from bridge_cudagraph.testing.world import parallel_state_untouched
from bridge_cudagraph.vision.encoder import GraphedQwen3VLVisionModel

_STATS = (
    "graphs",
    "layers",
    "seconds",
    "graph_memory_bytes",
    "replays",
    "eager_fallbacks",
    "failed",
    "param_grads_summed",
)


class InjectedTrainingFailure(RuntimeError):
    """What ``--end exception`` raises inside Bridge's training loop; the teardown test looks for its name."""


class Recorder(Callback):
    """Writes what the loop did to a JSON file; fires after the CudaGraphCallback (registered after it)."""

    def __init__(self, path: str, args: argparse.Namespace) -> None:
        self.path = path
        self.args = args
        self.graph_callback = None
        self.data: dict = {
            "args": vars(args),
            "pid": os.getpid(),
            "steps": [],
            "evals": [],
            "capture": {},
            "graphs": [],
            "releases": [],
        }
        self._t0 = 0.0

    def flush(self) -> None:
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1, default=str)
        os.replace(tmp, self.path)

    def _snapshot(self) -> None:
        lifecycle = getattr(self.graph_callback, "lifecycle", None)
        slots = lifecycle.slots if lifecycle is not None else []
        self.data["graphs"] = [
            {
                "submodule": s.submodule,
                "phase": s.phase.value,
                "warmup": s.warmup,
                "captured_at": s.captured_at,
                "manual_hooks": s.manual_hooks,
                "graphed_steps": s.graphed_steps,
                "failure": s.failure,
                "helper": type(s.helper).__name__,  # which engine: the ladder's helpers or megatron-core's
                **{k: getattr(s.helper.stats, k, None) for k in _STATS},
                # tight packing of the packed language graphs (capture/tight.py): None where the helper has none
                **{k: getattr(s.helper, k, None) for k in ("tight_replays", "tight_dropped_tokens")},
            }
            for s in slots
        ]
        for row in self.data["graphs"]:  # the numbers right after capture (delete resets them)
            if row["phase"] != Phase.PENDING.value and row["submodule"] not in self.data["capture"]:
                self.data["capture"][row["submodule"]] = dict(row)
        self.data["releases"] = list(getattr(self.graph_callback, "releases", []))

    def on_train_start(self, context) -> None:
        from megatron.core.utils import get_model_config

        # The CudaGraphCallback claimed the model config in its own on_train_start, which fired first.
        self.graph_callback = bridge_loop.owner_of(get_model_config(context.model[0]))
        self.data["start_step"] = context.state.train_state.step
        self.data["bridge_helper_name_installed"] = bridge_helper_installed()
        self.data["model_cuda_graph_impl"] = get_model_config(context.model[0]).cuda_graph_impl
        self.data["parallel_state_untouched_at_start"] = parallel_state_untouched()
        self.data["optimizer_walks_cached"] = optimizer_host.installed(context.optimizer)
        self.data["forward_installed"] = forward_host.installed(context.model)
        self.data["weights_at_start"] = _fingerprint(context.model)
        self.data["te_modules_fusing_wgrad"] = sum(wgrad_fusion.te_modules_fusing(chunk) for chunk in context.model)
        handler = signal.getsignal(signal.SIGTERM)  # Bridge's, with train.exit_signal_handler
        self.data["sigterm_handler"] = getattr(handler, "__qualname__", repr(handler))
        self._snapshot()
        self.flush()

    def on_train_step_start(self, context) -> None:
        torch.cuda.synchronize()
        self._t0 = time.perf_counter()

    def on_train_step_end(self, context) -> None:
        torch.cuda.synchronize()
        seconds = time.perf_counter() - self._t0
        loss = (context.loss_dict or {}).get("lm loss")
        iteration = context.state.train_state.step + 1  # Bridge increments after this event
        self.data["steps"].append(
            {
                "iteration": iteration,
                "loss": None if loss is None else float(loss),
                "seconds": seconds,
                "time": time.time(),
                "skipped": bool(context.skipped_iter),
                "grad_norm": None if context.grad_norm is None else float(context.grad_norm),
            }
        )
        # Read at every step: the callback drops the counts with the cache when it releases the graphs.
        self.data["optimizer_cached_steps"] = optimizer_host.cached_steps(context.optimizer)
        self.data["finalize_listed"] = finalize_host.installed(get_model_config(context.model[0]))
        # cpu_positions_calls, row_merges, flat_batches, grid_binds
        self.data.update(forward_host.counts_in(context.model))
        self.data["grids_read_back"] = sum(
            m.graph_helper.grids_read_back
            for chunk in context.model
            for m in chunk.modules()
            if isinstance(m, GraphedQwen3VLVisionModel) and m.graph_helper is not None
        )
        self.data["params_marked_added_to_main_grad"] = sum(
            bool(getattr(p, "grad_added_to_main_grad", False)) for chunk in context.model for p in chunk.parameters()
        )
        self._snapshot()
        self.flush()
        if iteration == self.args.end_at and self.args.end == "exception":
            self.data["end_time"] = time.time()
            self.flush()
            raise InjectedTrainingFailure(f"injected by the teardown test at iteration {iteration}")
        if iteration == self.args.end_at and self.args.end == "signal":
            self._wait_for_signal(context.state)

    def _wait_for_signal(self, state) -> None:
        """Tell the test to send SIGTERM now (graphs are captured), and hold the loop until Bridge's handler has
        seen it: the run then ends at this step boundary, not at whatever step the signal happens to land in."""
        handler = getattr(state, "signal_handler", None)  # None without train.exit_signal_handler
        self.data["ready_for_signal_time"] = time.time()
        self.flush()
        deadline = time.monotonic() + self.args.signal_wait
        while time.monotonic() < deadline and not getattr(handler, "_signal_received", False):
            time.sleep(0.02)  # Python runs the signal handler in this thread, between these sleeps
        self.data["signal_seen"] = bool(getattr(handler, "_signal_received", False))
        self.data["signal_seen_time"] = time.time()
        self.flush()

    def on_eval_start(self, context) -> None:
        self._eval_modes = [bool(chunk.training) for chunk in context.model]

    def on_eval_end(self, context) -> None:
        self.data["evals"].append(
            {
                "iteration": context.state.train_state.step,
                "losses": {k: float(v) for k, v in (context.total_loss_dict or {}).items()},
                "training_mode_during_eval": self._eval_modes,
                "graph_phases": [g["phase"] for g in self.data["graphs"]],
            }
        )
        self.flush()

    def on_train_end(self, context) -> None:
        self.data["train_end_time"] = time.time()
        # Before Bridge's teardown destroys whatever groups exist (which would hide an initialisation).
        self.data["parallel_state_untouched_at_end"] = parallel_state_untouched()
        self._snapshot()
        self.flush()


def _fingerprint(model) -> dict:
    """Parameter names and a float64 checksum: do two runs start from the same weights?"""
    names, total = [], 0.0
    with torch.no_grad():
        for chunk in model:
            for name, p in chunk.named_parameters():
                names.append(name)
                total += float(p.double().sum()) + float(p.double().abs().sum())
    return {"parameters": len(names), "names": sorted(names), "checksum": total}
