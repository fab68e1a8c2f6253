"""``bridge_cudagraph.bridge.train`` picks Bridge's entry point and forward step and always adds the graph callback."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from bridge_cudagraph.bridge import train
from bridge_cudagraph.bridge.callback import CudaGraphCallback
from bridge_cudagraph.bridge.throughput import ThroughputCallback
from bridge_cudagraph.examples import tiny
from bridge_cudagraph.host import bridge_helper, dataset_helpers, training_loop
from bridge_cudagraph.testing.plans import plan_for

PRETRAIN = "megatron.bridge.training.pretrain"


class Failure(RuntimeError):
    """Raised by the fake training loop."""


class EventList(list):
    """A list that also carries the fake's ``events``, ``raises`` and ``loop``."""


@pytest.fixture
def entries(monkeypatch):
    """Bridge's pretrain/finetune, recorded (their modules import nvidia_resiliency_ext, absent on CPU).

    Like Bridge's ``_pretrain``, the fake calls the loop by the pretrain module's name ``train`` (looked up at call
    time) and, when it raises, "aborts the process groups" (an event) before re-raising. Set ``calls.raises`` to
    make the loop raise.
    """
    calls = EventList()
    calls.events = []
    calls.raises = None

    def loop(callbacks):
        calls.events.append(("train", sys.modules[PRETRAIN].train is not loop))
        if calls.raises is not None:
            raise calls.raises

    def entry(name):
        def call(config, forward_step_func, callbacks=None):
            calls.append(SimpleNamespace(name=name, config=config, step=forward_step_func, callbacks=callbacks))
            try:
                sys.modules[PRETRAIN].train(callbacks)
            except BaseException as error:
                calls.events.append(("abort_process_groups", type(error).__name__))
                raise

        call.__name__ = name
        return call

    monkeypatch.setitem(sys.modules, PRETRAIN, SimpleNamespace(pretrain=entry("pretrain"), train=loop))
    monkeypatch.setitem(sys.modules, "megatron.bridge.training.finetune", SimpleNamespace(finetune=entry("finetune")))
    calls.loop = loop
    yield calls
    bridge_helper.uninstall_bridge_helper()
    dataset_helpers.restore_dataset_helpers()


@pytest.fixture
def releases(monkeypatch, entries):
    """Every ``CudaGraphCallback.release_graphs`` call, in order with the fake's events."""

    def release(self, reason="Bridge's _delete_cuda_graphs"):
        entries.events.append(("release", reason))
        return []

    monkeypatch.setattr(CudaGraphCallback, "release_graphs", release)
    return entries.events


def _config(model, pretrained=None):
    return SimpleNamespace(
        model=model,
        train=SimpleNamespace(train_iters=5),
        checkpoint=SimpleNamespace(pretrained_checkpoint=pretrained),
    )


def _plan(model):
    return plan_for(model, world_size=1, micro_batch_size=2, num_microbatches=1)


def _run(config, **kwargs):
    """``train.run`` with the plan of the fake config's model (the fakes are no ConfigContainer to finalize)."""
    return train.run(config, plan=_plan(config.model), **kwargs)


def test_forward_step_per_model_family():
    from megatron.bridge.models.qwen_vl import qwen3_vl_step
    from megatron.bridge.training import gpt_step

    assert train.forward_step_for(tiny.tiny_qwen3_vl_provider()) is qwen3_vl_step.forward_step
    assert train.forward_step_for(tiny.tiny_qwen3_vl_provider(moe=True)) is qwen3_vl_step.forward_step
    assert train.forward_step_for(tiny.tiny_gpt_provider()) is gpt_step.forward_step


def test_main_runs_bridge_pretrain_with_the_graph_callback_first(entries, capsys):
    extra = object()
    config = _config(tiny.tiny_qwen3_vl_provider())
    _run(config, callbacks=[extra])
    (call,) = entries
    assert call.name == "pretrain" and call.config is config
    assert isinstance(call.callbacks[0], CudaGraphCallback) and call.callbacks[2:] == [extra]
    assert isinstance(call.callbacks[1], ThroughputCallback)  # useful tokens/s, measured after the capture step
    assert bridge_helper.bridge_helper_installed()
    assert "pretrain() of CudaGraphQwen3VLModelProvider" in capsys.readouterr().out
    one = train.Run(SimpleNamespace(config=config), _plan(config.model))  # what `bridge-cudagraph train` runs
    assert one.train() == 0 and len(entries) == 2


def test_a_pretrained_checkpoint_means_finetune(entries):
    _run(_config(tiny.tiny_gpt_provider(), pretrained="/ckpt"))
    assert [c.name for c in entries] == ["finetune"]


def test_run_calls_bridges_loop_through_the_wrapper_and_restores_it(entries, releases):
    _run(_config(tiny.tiny_qwen3_vl_provider()))
    assert releases == [("train", True)]  # wrapped while pretrain ran; nothing raised, nothing released by run()
    assert sys.modules[PRETRAIN].train is entries.loop


@pytest.mark.parametrize("error", [Failure("boom"), SystemExit(0), KeyboardInterrupt()])
def test_when_the_loop_raises_graphs_go_before_bridge_aborts_and_the_error_propagates(entries, releases, error):
    entries.raises = error
    with pytest.raises(type(error)) as raised:
        _run(_config(tiny.tiny_qwen3_vl_provider()))
    assert raised.value is error  # re-raised as is, never swallowed or replaced
    name = type(error).__name__
    assert releases == [
        ("train", True),
        ("release", f"training loop raised {name}"),  # before Bridge's clean-up ...
        ("abort_process_groups", name),
        ("release", f"pretrain() raised {name}"),  # ... and run()'s idempotent backstop after it
    ]
    assert sys.modules[PRETRAIN].train is entries.loop


def test_a_failing_release_does_not_mask_the_training_error(entries, caplog):
    def release_graphs(reason):
        raise RuntimeError("delete failed")

    owner = SimpleNamespace(release_graphs=release_graphs)
    module = SimpleNamespace(train=entries.loop)
    entries.raises = Failure("the real one")
    with caplog.at_level(logging.ERROR, logger="bridge_cudagraph"):
        with pytest.raises(Failure, match="the real one"):
            with training_loop.release_graphs_if_training_raises(owner, module):
                module.train([])
    assert "releasing the CUDA graphs after a training failure failed" in caplog.text
    assert module.train is entries.loop


def test_a_bridge_without_the_loop_name_is_warned_about_and_run_still_releases(entries, releases, caplog):
    del sys.modules[PRETRAIN].train
    with caplog.at_level(logging.WARNING, logger="bridge_cudagraph"):
        with pytest.raises(AttributeError):  # the fake pretrain itself needs the name
            _run(_config(tiny.tiny_qwen3_vl_provider()))
    assert "no training loop named 'train'" in caplog.text
    assert releases[-1] == ("release", "pretrain() raised AttributeError")


def test_the_wrapper_keeps_the_loops_name_and_result():
    def loop(x, *, y):
        """Bridge's loop."""
        return x + y

    module = SimpleNamespace(train=loop)
    with training_loop.release_graphs_if_training_raises(SimpleNamespace(release_graphs=None), module):
        assert module.train is not loop and module.train.__wrapped__ is loop and module.train.__name__ == "loop"
        assert module.train(1, y=2) == 3 and module.train.__doc__ == "Bridge's loop."
    assert module.train is loop


def test_bridges_pretrain_calls_its_loop_by_the_module_name_the_wrapper_rebinds():
    """The wrapper works only while Bridge's ``_pretrain`` calls ``train(...)`` through its module global, inside the
    ``try`` whose ``except`` aborts the process groups (read from source: importing the module needs
    nvidia_resiliency_ext, which only the GPU machine has)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("megatron.bridge.training.pretrain")
    tree = ast.parse(Path(spec.origin).read_text())
    imported = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module == "megatron.bridge.training.train"
        for alias in node.names
    }
    assert "train" in imported
    (pretrain,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_pretrain"]
    (guarded,) = [n for n in pretrain.body if isinstance(n, ast.Try)]
    calls = [n for n in ast.walk(guarded) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "train"]
    assert len(calls) == 1
    handler = guarded.handlers[0]
    assert getattr(handler.type, "id", None) == "BaseException"
    cleanup = {getattr(n.func, "id", None) for n in ast.walk(handler) if isinstance(n, ast.Call)}
    assert "_cleanup_after_pretrain_failure" in cleanup  # the abort the wrapper must run ahead of


def test_run_hands_its_plan_to_the_graph_callback(entries):
    config = _config(tiny.tiny_qwen3_vl_provider())
    plan = _plan(config.model)
    train.run(config, plan=plan)
    assert entries[0].callbacks[0].plan is plan


REPO = Path(__file__).resolve().parents[3]

#: ``python -m bridge_cudagraph`` as on a machine whose CUDA driver shows a GPU: ``train`` passes its early check of
#: the driver (which on this machine, without one, answers first and at once: ``tests/unit/test_cli.py``) and comes
#: to the configuration's checks, then to torch's.
_DRIVER_SHOWS_A_GPU = (
    "import sys\n"
    "import bridge_cudagraph.cli as cli\n"
    "cli.cuda_device_count = lambda: (1, '')\n"
    "sys.exit(cli.main(sys.argv[1:]))\n"
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("recipe", "override", "world"),
    [
        ("tiny_qwen3_vl.yaml", "dataset.dataloader_type=batch", "1"),
        ("qwen3_vl_8b_sft_graphs.yaml", "dataset.enable_in_batch_packing=true", "8"),
    ],
)
def test_train_refuses_what_validate_refuses_with_the_same_line_before_the_gpu_check(recipe, override, world):
    """A real ``python -m bridge_cudagraph`` on this machine (no CUDA), its driver showing a GPU: ``train`` prints the
    configuration's error, the very line ``validate`` prints, not "needs a CUDA GPU"."""
    import os
    import subprocess

    def cli(verb):
        env = {**os.environ, "PYTHONPATH": str(REPO), "WORLD_SIZE": world}  # train's world, as torchrun sets it
        return subprocess.run(
            [sys.executable, "-c", _DRIVER_SHOWS_A_GPU, verb, str(REPO / "recipes" / recipe), override],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=600,
        )

    validate, trained = cli("validate"), cli("train")
    error = [line for line in validate.stderr.splitlines() if line.startswith("error:")]
    assert validate.returncode == 2 and len(error) == 1, validate.stderr[-2000:]
    assert "dataloader_type" in error[0] or "packing" in error[0]
    assert trained.returncode == 2, trained.stderr[-2000:]
    assert [line for line in trained.stderr.splitlines() if line.startswith("error:")] == error
    assert "CUDA" not in trained.stderr.split("error:")[-1]


@pytest.mark.slow
def test_train_builds_bridges_default_fusion_without_apex_up_to_the_gpu_check():
    """Bridge turns ``gradient_accumulation_fusion`` on whenever TE imports, and megatron-core's output layer then
    raises deep inside model construction without APEX (run 22's first 8B call). The SFT recipe keeps Bridge's
    default: on this machine (no APEX) ``train`` gets as far as the CUDA check with it, as with the fusion off,
    because this plugin's provider builds it (:mod:`bridge_cudagraph.host.wgrad_fusion`); ``validate`` accepts it."""
    import os
    import subprocess

    from bridge_cudagraph.host.compat import apex_gradient_accumulation_fusion_available

    if apex_gradient_accumulation_fusion_available():
        pytest.skip("APEX's fused_weight_gradient_mlp_cuda is installed here: the stack builds the fusion")
    recipe = str(REPO / "recipes" / "qwen3_vl_8b_sft_graphs.yaml")
    env = {**os.environ, "PYTHONPATH": str(REPO), "WORLD_SIZE": "8"}

    def cli(*args):
        return subprocess.Popen(
            [sys.executable, "-c", _DRIVER_SHOWS_A_GPU, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )

    runs = [cli("train", recipe), cli("train", recipe, "model.gradient_accumulation_fusion=false")]
    runs.append(cli("validate", recipe))
    (_, fused), (_, unfused), (ok, validate_err) = (p.communicate(timeout=600) for p in runs)
    codes = [p.returncode for p in runs]
    for code, err in ((codes[0], fused), (codes[1], unfused)):
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and len(errors) == 1 and "Traceback" not in err, err[-2000:]
        # torch's check, the last before the run: every configuration check has passed (not the driver's early one)
        assert err.splitlines()[-1].startswith("error: train needs a CUDA GPU"), err[-2000:]
        assert "(torch.cuda.is_available() is False)" in err.splitlines()[-1], err[-2000:]
    assert codes[2] == 0 and ok.startswith("ok:"), validate_err[-2000:]


def test_check_stack_reads_the_providers_switch():
    """The check itself: off passes everywhere; on passes on this plugin's provider (TE's layers fuse without APEX)
    and, without APEX, is refused on anything else that carries ``model.gradient_accumulation_fusion``."""
    from types import SimpleNamespace

    from bridge_cudagraph.config import CudaGraphConfigError
    from bridge_cudagraph.examples import tiny
    from bridge_cudagraph.host.compat import apex_gradient_accumulation_fusion_available
    from bridge_cudagraph.plan.checks import check_stack

    check_stack(SimpleNamespace(model=SimpleNamespace(gradient_accumulation_fusion=False)))
    check_stack(SimpleNamespace(model=tiny.tiny_gpt_provider(gradient_accumulation_fusion=True)))
    on = SimpleNamespace(model=SimpleNamespace(gradient_accumulation_fusion=True))
    if apex_gradient_accumulation_fusion_available():
        check_stack(on)
    else:
        with pytest.raises(CudaGraphConfigError, match=r"model\.gradient_accumulation_fusion=false"):
            check_stack(on)


def test_prepare_checks_and_plans_once_and_refuses_what_does_not_fit():
    """``bridge-cudagraph train``'s one owner before the GPU: the recipe planned as ``validate`` plans it, the
    ``--gpu-memory`` check against that plan, the run's settings kept for :meth:`~train.Run.train`."""
    from bridge_cudagraph.config import CudaGraphConfigError
    from bridge_cudagraph.recipe.load import load_recipe

    recipe = Path(__file__).resolve().parents[3] / "recipes" / "tiny_qwen3_vl.yaml"
    loaded = load_recipe(recipe)
    one = train.prepare(loaded, gpu_memory=80)
    assert isinstance(one, train.Run) and one.loaded is loaded and one.gpu_memory == 80
    assert one.plan.language.enabled and one.plan.memory is not None
    with pytest.raises(CudaGraphConfigError, match=r"--gpu-memory 0\.0001"):
        train.prepare(load_recipe(recipe), gpu_memory=0.0001)
