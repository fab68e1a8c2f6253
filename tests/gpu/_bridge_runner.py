"""One training run of the tiny Qwen3-VL recipe through Megatron-Bridge's real loop, for ``test_bridge_loop.py``
and ``test_teardown.py``.

Each run is its own process because Bridge initialises and destroys ``torch.distributed``, its process groups and
its globals once per process::

    python -m torch.distributed.run --standalone --nproc_per_node 1 tests/gpu/_bridge_runner.py \\
        --out run.json --graphs on --save DIR --save-interval 30 [--load DIR --ckpt-step 30] \\
        [--end normal|exception|signal --end-at 6] [--no-eval] [--recipe recipes/OTHER.yaml]

It loads ``recipes/tiny_qwen3_vl.yaml`` (or the ``--recipe`` file) with
:func:`bridge_cudagraph.recipe.load.load_recipe` (``--graphs off`` adds the overrides that disable both submodules) and
trains through :func:`bridge_cudagraph.bridge.train.run`, as the CLI's ``train`` verb does. It rewrites ``--out``
(JSON) after every training step, so a crash still leaves what ran: its pid, per-iteration loss, step time and
wall-clock time, evaluation losses, what the ``CudaGraphCallback`` captured, the initial weights' fingerprint, when
training ended (the test times the exit from there) and whether ``parallel_state`` was touched. A ``finally`` around
``run()`` writes the last word: how ``run()`` ended (``outcome``), the graphs' final phases and the callback's
``releases`` (who deleted the graphs, and whether the process groups were still up then).

How it ends (``--end``, for the teardown test):

* ``normal``: trains ``--iters`` iterations;
* ``exception``: raises :class:`InjectedTrainingFailure` from ``on_train_step_end`` of iteration ``--end-at``;
* ``signal``: at ``on_train_step_end`` of iteration ``--end-at`` writes ``ready_for_signal_time`` and waits (at
  most ``--signal-wait`` seconds) until Bridge's SIGTERM handler has seen a signal, which the test sends to the
  torchrun process; Bridge then ends the run at that step boundary.

Its module level imports nothing of the training stack (the recording callback is ``_bridge_recorder.py``, imported
in :func:`main`): every checkpoint save starts a ``spawn`` child that re-imports this script, and a heavy script
made each save 15-30 s slower (see ``_bridge_recorder``'s docstring).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

RECIPE = ROOT / "recipes" / "tiny_qwen3_vl.yaml"


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
    p.add_argument("--override", action="append", default=[], help="one more recipe override, key=value")
    p.add_argument("--recipe", default=str(RECIPE), help="recipe file (default recipes/tiny_qwen3_vl.yaml)")
    args = p.parse_args(argv)
    if args.end != "normal" and args.end_at is None:
        p.error(f"--end {args.end} needs --end-at")
    return args


def overrides(args: argparse.Namespace) -> list[str]:
    """The run's settings as command-line overrides of the recipe file (what a user would type)."""
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
    return out + list(args.override)


def main(argv=None) -> int:
    from _bridge_recorder import Recorder

    from bridge_cudagraph.bridge.train import run
    from bridge_cudagraph.recipe.load import load_recipe

    args = _args(argv)
    recorder = Recorder(args.out, args)
    recorder.data["launch_time"] = time.time()
    recorder.flush()  # the pid, early: a test that must kill a hung run finds the worker by it
    # The CLI's path: ``bridge-cudagraph train recipes/tiny_qwen3_vl.yaml k=v ...`` loads the same way.
    loaded = load_recipe(args.recipe, overrides(args))
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
        # After Bridge's teardown and bridge_cudagraph.bridge.train.run's: the graphs' final phases and who released
        # them.
        recorder.data["returned_time"] = time.time()
        recorder.data["outcome"] = outcome
        recorder._snapshot()
        recorder.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
