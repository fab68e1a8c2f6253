"""``bridge-cudagraph`` (also ``python -m bridge_cudagraph``): three verbs on a recipe file.

    bridge-cudagraph validate RECIPE.yaml [key=value ...] [--world-size N] [--gpu-memory GIB]   check; one line
    bridge-cudagraph plan     RECIPE.yaml [key=value ...] [--world-size N] [--gpu-memory GIB]   graphs and memory
    bridge-cudagraph train    RECIPE.yaml [key=value ...] [--gpu-memory GIB]                    Bridge's loop

``validate`` and ``plan`` need no GPU. A configuration error prints one ``error: ...`` line and exits 2. Errors in
the command line itself (an override that is no ``key=value``, ``--world-size 0``, ``--gpu-memory 0``, a recipe file
that is not there, ``train`` on a machine without a GPU) come before anything heavy is imported, in well under a
second (:func:`check_command_line`); the recipe's own errors need Megatron-Bridge imported (15-25 s on a laptop).
``--gpu-memory GIB`` refuses a run whose estimated memory per rank does not fit GIB (``plan`` prints the estimate);
``train`` also caps the process at GIB (an 80 GB GPU on a larger one) and checks against the device it has.
The verbs and flags are frozen by ``tests/unit/test_cli.py``; add knobs to the recipe, not here.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import sys
import typing
import warnings
from collections.abc import Sequence

#: The verbs, in help order.
VERBS: tuple[str, ...] = ("validate", "plan", "train")
_NEEDS_GPU = ("train",)
_HELP = {
    "validate": "load the recipe, finalize it as Bridge's training would and check the graphs (no GPU needed)",
    "plan": "print the process-group layouts, graphs and static shapes the recipe will capture (no GPU needed)",
    "train": "train with Megatron-Bridge's loop and bridge_cudagraph's graphs (run under torchrun)",
}


class CliError(Exception):
    """A condition the CLI reports as one ``error:`` line with exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse's parser with its usage errors in the CLI's form: one ``error:`` line, exit 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"error: {message}; see `{self.prog} --help`\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (frozen: see the module docstring)."""
    parser = _Parser(
        prog="bridge-cudagraph",
        description="Faithful per-layer CUDA graphs for Megatron-Bridge recipes.",
        allow_abbrev=False,
    )
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="{" + ",".join(VERBS) + "}")
    for verb in VERBS:
        sub = verbs.add_parser(verb, help=_HELP[verb], description=_HELP[verb], allow_abbrev=False)
        sub.add_argument("recipe", help="recipe YAML file (schema: recipes/README.md)")
        sub.add_argument(
            "overrides", nargs="*", metavar="key=value", help="Hydra-style overrides, applied after the YAML"
        )
        if verb in ("validate", "plan"):
            sub.add_argument(
                "--world-size", type=int, default=None, metavar="N", help="GPUs to plan for (default: the YAML's)"
            )
        sub.add_argument(
            "--gpu-memory",
            type=float,
            default=None,
            metavar="GIB",
            help="GPU memory per rank to fit in (train: also caps PyTorch's allocator at it; the CUDA context and "
            "NCCL's buffers come on top)",
        )
    return parser


def _count(n: int | None, noun: str) -> str:
    if n is None:
        return f"no {noun}es" if noun.endswith("h") else f"no {noun}s"
    plural = noun + ("es" if noun.endswith("h") else "s")
    return f"{n} {noun if n == 1 else plural}"


def _one_line(error: BaseException) -> str:
    text = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
    return " ".join(text.split()) or type(error).__name__


def _no_gpu(verb: str, why: str) -> CliError:
    return CliError(
        f"{verb} needs a CUDA GPU and this machine has none ({why}); run it on a GPU machine (under torchrun for "
        "several GPUs), or use `plan` / `validate` here"
    )


def cuda_device_count() -> tuple[int, str]:
    """The CUDA devices the driver shows this process, asked of ``libcuda`` itself (no torch import: a few
    milliseconds), and in words why there are none. Where the driver sees a device, torch may still not (a CPU-only
    build): :func:`_require_cuda` asks torch once the configuration is checked."""
    import ctypes

    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0, "no CUDA driver: libcuda.so.1 does not load"
    count = ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        return 0, "the CUDA driver shows no device" + (
            "" if visible is None else f", CUDA_VISIBLE_DEVICES={visible!r}"
        )
    return count.value, ""


def _require_cuda(verb: str) -> None:
    import torch  # after the configuration's checks: torch itself, then the Megatron stack, are heavy to import

    if not torch.cuda.is_available():
        raise _no_gpu(verb, "torch.cuda.is_available() is False")


def check_gpu_memory(gib: float) -> None:
    """``--gpu-memory GIB`` must be a positive, finite number of GiB."""
    if not (gib > 0 and math.isfinite(gib)):
        raise CliError(f"--gpu-memory must be a positive number of GiB (80 for an 80 GB H100), got {gib:g}")


def check_command_line(args: argparse.Namespace) -> None:
    """The command line's own errors, before anything heavy is imported (the recipe's need Megatron-Bridge): each
    override is ``key=value`` with a key Hydra can read, ``--world-size`` and ``--gpu-memory`` are positive, the recipe
    file is there, and ``train`` has a GPU (asked of the CUDA driver; torch answers again after the configuration's
    checks). One ``error:`` line each, like every refusal."""
    from bridge_cudagraph.plan.sizes import check_world_size
    from bridge_cudagraph.recipe.load import check_override_syntax, check_recipe_file

    check_override_syntax(args.overrides)
    if getattr(args, "world_size", None) is not None:
        check_world_size(args.world_size)
    if args.gpu_memory is not None:
        check_gpu_memory(args.gpu_memory)
    check_recipe_file(args.recipe)
    if args.verb in _NEEDS_GPU:
        count, why = cuda_device_count()
        if count < 1:
            raise _no_gpu(args.verb, why)


def _run(args: argparse.Namespace) -> int:
    from bridge_cudagraph.recipe.load import load_recipe

    with _configuration_phase():
        loaded = load_recipe(args.recipe, args.overrides)
        if args.verb == "train":
            from bridge_cudagraph.bridge.train import prepare

            # The configuration's checks come before the GPU check: what `validate` refuses, `train` refuses with
            # the same line on any machine (prepare plans the run as `validate` does), and also a base checkpoint
            # that is not on this machine, which `validate` and `plan` only report.
            run = prepare(loaded, gpu_memory=args.gpu_memory)
        else:
            plan, no_base = _plan(loaded, args)
    if args.verb == "train":
        _require_cuda(args.verb)
        return run.train()
    if args.verb == "plan":
        print(f"recipe: {loaded.source}" + ("" if not args.overrides else " " + " ".join(args.overrides)))
        if loaded.description:
            print(f"  {loaded.description}")
        if no_base is not None:
            print(f"  {no_base}: a plan does not read the base checkpoint; train needs it")
        print(plan.describe())
        return 0
    vision = plan.vision.graphs if plan.vision is not None and plan.vision.enabled else 0
    print(
        f"ok: {loaded.source} at {_count(plan.world_size, 'GPU')}: language {plan.language.graphs} + vision "
        f"{vision} graphs per rank, {_count(plan.num_microbatches, 'micro-batch')} per step"
        + ("" if no_base is None else f"; {no_base} (train needs it)")
    )
    return 0


def _plan(loaded, args: argparse.Namespace):
    """``validate`` and ``plan``: the plan, checked against ``--gpu-memory``, and what the run lacks of its base
    checkpoint (a plan never reads it: said, not refused)."""
    from bridge_cudagraph.plan.from_config import missing_base_checkpoint, plan_config

    no_base = missing_base_checkpoint(loaded.config)
    plan = plan_config(loaded.config, world_size=loaded.world(args.world_size), base_checkpoint_needed=False)
    if args.gpu_memory is not None:
        from bridge_cudagraph.plan.memory import check_plan_fits

        check_plan_fits(plan, args.gpu_memory, source=f"--gpu-memory {args.gpu_memory:g}")
    return plan, no_base


@contextlib.contextmanager
def _configuration_phase():
    """Loading, checking and planning: what fails here is the configuration, for every verb, and is said in one line
    (an assertion or a ``ValueError`` of the host with the settings its check reads,
    :func:`bridge_cudagraph.host.refusals.host_refusal_line`); the plugin's own refusals pass through as they are."""
    from bridge_cudagraph.config import CudaGraphConfigError

    try:
        yield
    except CudaGraphConfigError:
        raise
    except (ValueError, AssertionError) as error:
        from bridge_cudagraph.host.refusals import host_refusal_line

        raise CliError(host_refusal_line(error) or _one_line(error)) from error


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse a command line; ``key=value`` overrides may come before or after ``--world-size``."""
    parser = build_parser()
    # argparse stops filling a positional list at the first flag; overrides after --world-size come back
    # as leftovers, and are accepted as long as they look like key=value.
    args, leftover = parser.parse_known_args(argv)
    stray = [a for a in leftover if a.startswith("-") or "=" not in a]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    args.overrides = [*args.overrides, *leftover]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 2 a configuration error)."""
    from bridge_cudagraph.config import CudaGraphConfigError, UnknownKeyError
    from bridge_cudagraph.recipe.load import RecipeError

    args = parse_args(argv)
    try:
        check_command_line(args)
    except (CliError, RecipeError, CudaGraphConfigError) as error:
        print(f"error: {_one_line(error)}", file=sys.stderr)
        return 2
    if args.verb in ("validate", "plan"):
        # Importing megatron.training sets the root logger to INFO on stdout (training.py: basicConfig);
        # configuring it first keeps stdout to the plan and the stack's chatter on stderr.
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
        # Import-time chatter of the stack (Apex missing, deprecations) says nothing about the recipe.
        warnings.simplefilter("ignore")
    try:
        return _run(args)
    except (CliError, UnknownKeyError, CudaGraphConfigError) as error:
        print(f"error: {_one_line(error)}", file=sys.stderr)
        return 2
    except (ValueError, AssertionError) as error:
        if args.verb in _NEEDS_GPU and not _is_config_error(error):
            raise  # a failure while training is not a configuration error: keep its traceback
        print(f"error: {_one_line(error)}", file=sys.stderr)
        return 2


def _is_config_error(error: BaseException) -> bool:
    """Whether a ValueError comes from loading the recipe (ours) rather than from the training run."""
    from bridge_cudagraph.parallel.layout import LayoutError
    from bridge_cudagraph.recipe.load import RecipeError

    return isinstance(error, RecipeError | LayoutError)


if __name__ == "__main__":
    sys.exit(main())
