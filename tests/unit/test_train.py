"""``bridge_cudagraph.train`` picks Bridge's entry point and forward step and always adds the graph callback."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from bridge_cudagraph import bridge_loop, train
from bridge_cudagraph.callback import CudaGraphCallback
from bridge_cudagraph.harness import tiny


@pytest.fixture
def entries(monkeypatch):
    """Bridge's pretrain/finetune, recorded (their modules import nvidia_resiliency_ext, absent on CPU)."""
    calls = []

    def entry(name):
        def call(config, forward_step_func, callbacks=None):
            calls.append(SimpleNamespace(name=name, config=config, step=forward_step_func, callbacks=callbacks))

        call.__name__ = name
        return call

    monkeypatch.setitem(sys.modules, "megatron.bridge.training.pretrain", SimpleNamespace(pretrain=entry("pretrain")))
    monkeypatch.setitem(sys.modules, "megatron.bridge.training.finetune", SimpleNamespace(finetune=entry("finetune")))
    yield calls
    bridge_loop.uninstall()


def _config(model, pretrained=None):
    return SimpleNamespace(
        model=model,
        train=SimpleNamespace(train_iters=5),
        checkpoint=SimpleNamespace(pretrained_checkpoint=pretrained),
    )


def test_forward_step_per_model_family():
    from megatron.bridge.models.qwen_vl import qwen3_vl_step
    from megatron.bridge.training import gpt_step

    assert train.forward_step_for(tiny.tiny_qwen3_vl_provider()) is qwen3_vl_step.forward_step
    assert train.forward_step_for(tiny.tiny_qwen3_vl_provider(moe=True)) is qwen3_vl_step.forward_step
    assert train.forward_step_for(tiny.tiny_gpt_provider()) is gpt_step.forward_step


def test_main_runs_bridge_pretrain_with_the_graph_callback_first(entries, capsys):
    extra = object()
    config = _config(tiny.tiny_qwen3_vl_provider())
    train.run(config, callbacks=[extra])
    (call,) = entries
    assert call.name == "pretrain" and call.config is config
    assert isinstance(call.callbacks[0], CudaGraphCallback) and call.callbacks[1:] == [extra]
    assert bridge_loop.installed()
    assert "pretrain() of CudaGraphQwen3VLModelProvider" in capsys.readouterr().out
    assert train.main(SimpleNamespace(config=config), None) == 0 and len(entries) == 2


def test_a_pretrained_checkpoint_means_finetune(entries):
    train.run(_config(tiny.tiny_gpt_provider(), pretrained="/ckpt"))
    assert [c.name for c in entries] == ["finetune"]
