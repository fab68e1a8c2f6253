"""``bridge-cudagraph``: the frozen verbs and flags, and ``plan`` / ``validate`` / error paths run for real as
``python -m bridge_cudagraph`` subprocesses without a GPU (started together, since each imports the stack)."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _processes import awaited

from bridge_cudagraph.cli import VERBS, build_parser, parse_args

ROOT = Path(__file__).resolve().parents[2]

#: Seconds an error in the command line itself may take, start to exit: Python's start and the light modules (about
#: 0.15 s here); importing Megatron-Bridge first took 17-21 s.
FAST = 5.0

#: The whole command-line surface. A new flag is a deliberate change of this table (torchtitan's
#: test_no_new_cli_options); knobs belong in the recipe.
FROZEN = {
    "validate": {"recipe", "overrides", "--world-size", "--gpu-memory"},
    "plan": {"recipe", "overrides", "--world-size", "--gpu-memory"},
    "train": {"recipe", "overrides", "--gpu-memory"},
}


def _surface(parser: argparse.ArgumentParser) -> dict[str, set[str]]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = {}
    for verb, verb_parser in sub.choices.items():
        names = set()
        for action in verb_parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            names |= set(action.option_strings) if action.option_strings else {action.dest}
        out[verb] = names
    return out


def test_verbs_and_flags_are_frozen():
    """Exactly the three verbs, each with exactly its flags (the benchmarks are `python -m benchmarks.<name>`)."""
    assert VERBS == ("validate", "plan", "train")
    assert _surface(build_parser()) == FROZEN


def test_overrides_may_follow_flags():
    """``key=value`` overrides are collected before and after ``--world-size``."""
    args = parse_args(["plan", "r.yaml", "a.b=1", "--world-size", "8", "c=[1,2]"])
    assert (args.verb, args.recipe, args.world_size, args.overrides) == ("plan", "r.yaml", 8, ["a.b=1", "c=[1,2]"])
    assert parse_args(["train", "r.yaml"]).overrides == []


def test_stray_arguments_are_refused(capsys):
    """Anything that is not a flag of the verb or a key=value is a usage error (exit 2)."""
    with pytest.raises(SystemExit) as info:
        parse_args(["plan", "r.yaml", "--world", "8"])
    assert info.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["train", "r.yaml", "--world-size", "8"])


def _cli(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen(
        [sys.executable, "-m", "bridge_cudagraph", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.fixture(scope="module")
def runs():
    """The slow subprocesses, started at once; each test waits for its own."""
    started = {
        "plan": _cli("plan", "recipes/qwen3_vl_8b_sft_graphs.yaml", "--world-size", "8"),
        "validate": _cli(
            "validate",
            "recipes/qwen3_8b_sft_graphs.yaml",  # Bridge's offline packing: packed graphs of whole layers
            "--world-size",
            "64",
        ),
        "unknown": _cli(
            "validate", "recipes/qwen3_vl_8b_sft_graphs.yaml", "model.cuda_graph.vision.token_budget=[64]"
        ),
        "too_small": _cli("validate", "recipes/qwen3_vl_8b_sft_graphs.yaml", "--world-size", "8", "--gpu-memory", "8"),
    }
    with awaited(started) as result:
        yield result


def test_plan_prints_the_plan(runs):
    """``plan`` at 8 GPUs prints layouts, graph counts and budgets to stdout, nothing else."""
    code, out, err = runs("plan")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "recipe: recipes/qwen3_vl_8b_sft_graphs.yaml"
    assert "capture plan: CudaGraphQwen3VLModelProvider on 8 ranks, bf16" in lines
    assert "  micro-batch 2, global batch 128, micro-batches per step 16 (128 / (2 x dp 4))" in lines
    assert "  dense  tp 2 x cp 1 x dp 4 x pp 1 = 8" in lines and "  dense  tp 1 x cp 1 x dp 8 x pp 1 = 8" in lines
    i = lines.index("language: 36 layers in 4 runs x 1 graph each (pp 1) = 4 graphs per rank,")
    assert lines[i + 1] == "  whole layers, capture after 3 steps (model.cuda_graph_warmup_steps)"
    assert "  runs of layers: 0, 1, 2, 3-35; cut after each of the first 3 (a deepstack merge follows)" in lines
    assert any(line.startswith("vision: 4 graphs x 21 budgets = 84 graphs per rank") for line in lines)
    i = next(i for i, line in enumerate(lines) if line.startswith("  budgets [512, 576, 704, "))
    assert lines[i + 1] == "    20992, 26240, 32768] patches"  # the bound, 4096 x 2**2 x 2, wrapped at 119 columns
    assert lines[i + 2] == "    derived: S 4096 x 2**2 x mbs 2 = 32768 max, 21 rungs <= 1.25x apart"
    # Bridge's recipe names Qwen/Qwen3-VL-8B-Instruct as its processor: Bridge's Qwen-VL collate caps an image at
    # max_pixels 1003520, so at 3920 patches, and the plan says where the number comes from.
    i = lines.index("  at most 3920 patches per image (the static attention max_seqlen):")
    assert lines[i + 1] == (
        "    from max_pixels 1003520 // 16**2 = 3920, passed to the processor by Bridge's collate, qwen2_5_collate_fn"
    )
    assert lines[-1].startswith("busiest rank: 88 graphs")
    assert max(map(len, lines)) <= 119


def test_validate_says_ok_in_one_line(runs):
    """``validate`` finalizes through Bridge at the given world size and prints one summary line."""
    code, out, err = runs("validate")
    assert code == 0, err
    assert out == (
        "ok: recipes/qwen3_8b_sft_graphs.yaml at 64 GPUs: language 1 + vision 0 graphs per rank, "
        "2 micro-batches per step\n"
    )


def test_error_is_one_line_without_traceback(runs):
    """A configuration error: exit 2, one ``error:`` line on stderr naming the setting, no traceback."""
    code, out, err = runs("unknown")
    assert code == 2 and out == ""
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: unknown setting model.cuda_graph.vision.token_budget (did you mean 'token_budgets'?); valid keys of "
        "model.cuda_graph.vision: enabled, graph_unit, max_images_per_microbatch, "
        "max_patches_per_image, modules, tensor_parallel_size, token_budgets, warmup_steps"
    ]
    assert err.rstrip("\n").splitlines()[-1] == errors[0]


def test_missing_recipe_file():
    """Errors before any heavy import are just as short."""
    done = subprocess.run(
        [sys.executable, "-m", "bridge_cudagraph", "validate", "no/such.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert (done.returncode, done.stdout, done.stderr) == (2, "", "error: recipe file no/such.yaml does not exist\n")


@pytest.mark.parametrize("verb", ["train"])
def test_gpu_verbs_fail_fast_without_cuda(verb):
    """Without CUDA, ``train`` stops with one line before anything heavy is imported (the CUDA driver is asked,
    not torch); a recipe file that is not there is named first. Where the driver shows a GPU, the recipe's own
    checks come before torch's (``tests/unit/bridge/test_train.py``)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the verb would really run")
    missing = subprocess.run(
        [sys.executable, "-m", "bridge_cudagraph", verb, "no/such.yaml"], cwd=ROOT, capture_output=True, text=True
    )
    assert (
        missing.returncode == 2 and missing.stderr.splitlines()[-1] == "error: recipe file no/such.yaml does not exist"
    )
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "bridge_cudagraph", verb, "recipes/tiny_qwen3_vl.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    assert done.returncode == 2 and done.stdout == ""
    # The parenthesis says what the driver said: no libcuda here, or (a driver without a device) no device.
    assert re.fullmatch(
        rf"error: {verb} needs a CUDA GPU and this machine has none \((no CUDA driver|the CUDA driver shows no "
        r"device)[^)]*\); run it on a GPU machine \(under torchrun for several GPUs\), or use `plan` / `validate` "
        r"here\n",
        done.stderr,
    ), done.stderr
    assert seconds < FAST, f"{seconds:.1f} s"


def test_console_script():
    """The ``bridge-cudagraph`` entry point of pyproject is installed and lists the verbs."""
    script = Path(sys.executable).parent / "bridge-cudagraph"
    if not script.exists():
        pytest.skip("the package is not installed as a distribution here (NGC path: python -m bridge_cudagraph)")
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "{validate,plan,train}" in done.stdout


#: What a spawned child must not import again: the training stack (15-27 s on a 2-core host).
_STACK = ("torch", "megatron", "transformer_engine")
_PIP_SCRIPT = "import sys\nfrom bridge_cudagraph.cli import main\nif __name__ == '__main__':\n    sys.exit(main())\n"


@pytest.mark.parametrize(
    "how",
    ["python -m bridge_cudagraph", "bridge-cudagraph script", "tests/gpu/_bridge_runner.py"],
)
def test_a_spawned_child_imports_no_training_stack(tmp_path, how):
    """Bridge's checkpoint save starts megatron-core's write-results queue, a ``spawn`` multiprocessing Manager; its
    child re-imports the launching ``__main__`` as ``__mp_main__`` before it serves anything. A main module that
    imports the stack at its top makes every save pay that import again (15-27 s against 0.07-0.14 s on a 2-core host,
    ``results/teardown/``), which is what pushed SIGTERM saves past torchrun's fixed 30 s grace.
    The child's preparation runs here exactly as ``multiprocessing.spawn`` runs it, for each way ``train`` is
    launched."""
    if how == "python -m bridge_cudagraph":
        data = {"init_main_from_name": "bridge_cudagraph.__main__"}
    elif how == "bridge-cudagraph script":
        script = tmp_path / "bridge-cudagraph"
        script.write_text(_PIP_SCRIPT)  # what pip writes for pyproject's [project.scripts] entry
        data = {"init_main_from_path": str(script)}
    else:
        data = {"init_main_from_path": str(ROOT / "tests" / "gpu" / "_bridge_runner.py")}
    probe = (
        "import sys, multiprocessing.spawn as spawn\n"
        f"spawn.prepare({data!r})\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {_STACK!r}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", f"{how}: the spawned child imported {done.stdout.strip()[:300]}"


def test_the_probe_sees_a_heavy_main(tmp_path):
    """The check above can fail: a main module that imports torch at its top is caught."""
    script = tmp_path / "heavy.py"
    script.write_text("import torch\n")
    probe = (
        "import sys, multiprocessing.spawn as spawn\n"
        f"spawn.prepare({{'init_main_from_path': {str(script)!r}}})\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr[-2000:]


#: (argv, the one line): errors in the command line itself, answered before anything heavy is imported.
COMMAND_LINE_ERRORS = [
    (["plan", "x.yaml", "foo"], "error: override 'foo' is not key=value (e.g. model.seq_length=4096)"),
    (
        ["plan", "recipes/tiny_qwen3_vl.yaml", "foo"],
        "error: override 'foo' is not key=value (e.g. model.seq_length=4096)",
    ),
    (
        ["validate", "recipes/tiny_qwen3_vl.yaml", "model.cuda_graph.lánguage.enabled=true"],
        "error: override 'model.cuda_graph.lánguage.enabled=true': the key has 'á' (U+00E1 LATIN SMALL LETTER A WITH "
        "ACUTE) at column 19, which a setting's name cannot hold; did you mean model.cuda_graph.language.enabled?",
    ),
    (
        ["plan", "recipes/tiny_qwen3_vl.yaml", "--world-size", "0"],
        "error: world size must be a positive integer (GPUs of the job), got 0; pass --world-size N (validate, plan) "
        "or launch with torchrun (train)",
    ),
    (
        ["validate", "recipes/tiny_qwen3_vl.yaml", "--gpu-memory", "0"],
        "error: --gpu-memory must be a positive number of GiB (80 for an 80 GB H100), got 0",
    ),
    (
        ["train", "recipes/tiny_qwen3_vl.yaml", "--gpu-memory", "-80"],
        "error: --gpu-memory must be a positive number of GiB (80 for an 80 GB H100), got -80",
    ),
    (
        ["plan", "recipes/tiny_qwen3_vl.yaml", "--world", "8"],
        "error: unrecognized arguments: --world 8; see `bridge-cudagraph --help`",
    ),
    (
        ["plan", "recipes/tiny_qwen3_vl.yaml", "--world-size", "two"],
        "error: argument --world-size: invalid int value: 'two'; see `bridge-cudagraph plan --help`",
    ),
]


@pytest.mark.parametrize(
    ("argv", "line"), COMMAND_LINE_ERRORS, ids=[" ".join(c[0][:1] + c[0][2:]) for c in COMMAND_LINE_ERRORS]
)
def test_command_line_errors_are_one_line_in_seconds(argv, line):
    """``python -m bridge_cudagraph`` as a user runs it: exit 2, exactly one ``error:`` line, in under FAST seconds
    (Megatron-Bridge's import alone takes 15-25 s here, so a slow path cannot pass)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "bridge_cudagraph", *argv], cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    assert (done.returncode, done.stdout, done.stderr) == (2, "", line + "\n")
    assert seconds < FAST, f"{' '.join(argv)} took {seconds:.1f} s"


def test_command_line_errors_import_no_training_stack():
    """The same errors in-process: torch and Megatron are still not imported after them (the reason they are fast)."""
    probe = (
        "import sys\n"
        "from bridge_cudagraph.cli import main\n"
        "codes = [main(a) for a in (['plan', 'x.yaml', 'foo'], ['plan', 'recipes/tiny_qwen3_vl.yaml', '--world-size',"
        " '0'], ['train', 'recipes/tiny_qwen3_vl.yaml'])]\n"
        "print(codes, sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron', 'transformer_engine',"
        " 'omegaconf', 'hydra')))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[2, 2, 2] []"
    assert len(done.stderr.splitlines()) == 3 and all(x.startswith("error: ") for x in done.stderr.splitlines())


def test_plan_prints_the_memory_estimate_and_validate_refuses_a_gpu_too_small(runs):
    """``plan`` prints the estimate per rank; ``--gpu-memory`` below it is one line naming what to change."""
    code, out, err = runs("plan")
    assert code == 0, err
    lines = out.splitlines()
    memory = next(x for x in lines if x.startswith("memory per rank (estimate, GiB): weights "))
    assert "gradients" in memory and "optimizer" in memory, memory
    assert any(x.startswith("  graph pools: language ") and "vision " in x for x in lines), lines
    code, out, err = runs("too_small")
    assert code == 2 and out == "", (code, out, err)
    assert "Traceback" not in err, err
    (line,) = [x for x in err.splitlines() if x.startswith("error: ")]  # the host's import warnings are not ours
    assert line.startswith("error: the run needs about ") and "but --gpu-memory 8 gives 8 GiB" in line, line
    assert "model.cuda_graph.language.token_budgets below" not in line  # a padded recipe: no language ladder to cap
    assert "model.cuda_graph.vision.token_budgets below" in line, line
