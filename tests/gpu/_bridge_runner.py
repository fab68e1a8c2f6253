"""One training run of the tiny Qwen3-VL recipe through Megatron-Bridge's real loop, for ``test_bridge_loop.py``
and ``test_teardown.py``.

Each run is its own process because Bridge initialises and destroys ``torch.distributed``, its process groups and
its globals once per process::

    python -m torch.distributed.run --standalone --nproc_per_node 1 tests/gpu/_bridge_runner.py \\
        --out run.json --graphs on --save DIR --save-interval 30 [--load DIR --ckpt-step 30] \\
        [--end normal|exception|signal --end-at 6] [--no-eval]

It loads ``recipes/tiny_qwen3_vl.yaml`` with :func:`bridge_cudagraph.recipe.load_recipe` (``--graphs off`` adds the
overrides that disable both submodules) and trains through :func:`bridge_cudagraph.train.run`, as the CLI's
``train`` verb does. It rewrites ``--out`` (JSON) after every training step, so a crash still leaves what ran:
its pid, per-iteration loss, step time and wall-clock time, evaluation losses, what the ``CudaGraphCallback``
captured, the initial weights' fingerprint, when training ended (the test times the exit from there) and whether
``parallel_state`` was touched. A ``finally`` around ``run()`` writes the last word: how ``run()`` ended
(``outcome``), the graphs' final phases and the callback's ``releases`` (who deleted the graphs, and whether the
process groups were still up then).

How it ends (``--end``, for the teardown test):

* ``normal``: trains ``--iters`` iterations;
* ``exception``: raises :class:`InjectedTrainingFailure` from ``on_train_step_end`` of iteration ``--end-at``;
* ``signal``: at ``on_train_step_end`` of iteration ``--end-at`` writes ``ready_for_signal_time`` and waits (at
  most ``--signal-wait`` seconds) until Bridge's SIGTERM handler has seen a signal, which the test sends to the
  torchrun process; Bridge then ends the run at that step boundary.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from megatron.bridge.training.callbacks import Callback  # noqa: E402

from bridge_cudagraph import bridge_loop  # noqa: E402
from bridge_cudagraph.callback import Phase  # noqa: E402
from bridge_cudagraph.host_patches import bridge_helper_installed  # noqa: E402
from bridge_cudagraph.testing.world import parallel_state_untouched  # noqa: E402

RECIPE = ROOT / "recipes" / "tiny_qwen3_vl.yaml"
_STATS = ("graphs", "layers", "seconds", "graph_memory_bytes", "replays", "eager_fallbacks", "failed")


def _args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON file this run writes")
    p.add_argument("--graphs", choices=("on", "off"), required=True)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--save", default=None, help="checkpoint directory (none: do not save)")
    p.add_argument("--save-interval", type=int, default=None)
    p.add_argument("--load", default=None, help="checkpoint directory to resume from")
    p.add_argument("--ckpt-step", type=int, default=None, help="iteration to resume from (default: latest)")
    p.add_argument("--end", choices=("normal", "exception", "signal"), default="normal", help="how training ends")
    p.add_argument("--end-at", type=int, default=None, help="iteration of --end exception/signal")
    p.add_argument("--signal-wait", type=float, default=120.0, help="--end signal: longest wait for the signal (s)")
    p.add_argument("--no-eval", action="store_true", help="no evaluation, during or after training")
    args = p.parse_args(argv)
    if args.end != "normal" and args.end_at is None:
        p.error(f"--end {args.end} needs --end-at")
    return args


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
                **{k: getattr(s.helper.stats, k, None) for k in _STATS},
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
        self.data["weights_at_start"] = _fingerprint(context.model)
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


def overrides(args: argparse.Namespace) -> list[str]:
    """The run's settings as command-line overrides of ``recipes/tiny_qwen3_vl.yaml`` (what a user would type)."""
    out = [f"train.train_iters={args.iters}", f"checkpoint.save={args.save or 'null'}"]
    if args.save_interval is not None:
        out.append(f"checkpoint.save_interval={args.save_interval}")
    if args.load is not None:
        out.append(f"checkpoint.load={args.load}")
    if args.ckpt_step is not None:
        out.append(f"checkpoint.ckpt_step={args.ckpt_step}")
    if args.graphs == "off":
        out += ["model.cuda_graph.language.enabled=false", "model.cuda_graph.vision.enabled=false"]
    if args.no_eval:  # Bridge builds no validation or test data then, and evaluates neither during nor after training
        out += ["validation.eval_iters=0", "validation.eval_interval=null"]
    return out


def main(argv=None) -> int:
    from bridge_cudagraph.recipe import load_recipe
    from bridge_cudagraph.train import run

    args = _args(argv)
    recorder = Recorder(args.out, args)
    recorder.data["launch_time"] = time.time()
    recorder.flush()  # the pid, early: a test that must kill a hung run finds the worker by it
    # The CLI's path: ``bridge-cudagraph train recipes/tiny_qwen3_vl.yaml k=v ...`` loads the same way.
    loaded = load_recipe(RECIPE, overrides(args))
    recorder.data["overrides"] = list(loaded.overrides)
    outcome: dict = {"kind": "returned"}
    try:
        run(loaded.config, callbacks=[recorder])
    except SystemExit as error:  # Bridge's sys.exit(exit_code) after an early exit (SIGTERM with the handler on)
        outcome = {"kind": "SystemExit", "code": error.code}
        raise
    except BaseException as error:
        outcome = {"kind": type(error).__name__, "message": str(error)[:500]}
        raise
    finally:
        # After Bridge's teardown and bridge_cudagraph.train.run's: the graphs' final phases and who released them.
        recorder.data["returned_time"] = time.time()
        recorder.data["outcome"] = outcome
        recorder._snapshot()
        recorder.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
