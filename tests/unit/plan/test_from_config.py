"""``bridge_cudagraph.plan.from_config``: a PEFT base checkpoint that is not on this machine stops Bridge's
finalization for a run, not for a plan; the plan keeps the path, and the environment comes back as it was."""

from __future__ import annotations

import os

import pytest

from bridge_cudagraph.bridge.providers import with_cuda_graphs
from bridge_cudagraph.examples.tiny_recipe import tiny_qwen3_vl_config
from bridge_cudagraph.plan.from_config import absent_base_checkpoint, missing_base_checkpoint, plan_config


@pytest.fixture
def peft_config(tmp_path):
    """The tiny recipe as a LoRA fine-tune whose base checkpoint is not on this machine."""
    from megatron.bridge.peft.lora import LoRA

    cfg = tiny_qwen3_vl_config(checkpoint_dir=str(tmp_path / "ckpt"))
    cfg.model = with_cuda_graphs(cfg.model, language={"enabled": True})
    cfg.peft = LoRA()
    cfg.checkpoint.pretrained_checkpoint = str(tmp_path / "no-such-base")
    return cfg


def test_absent_base_checkpoint(peft_config, tmp_path):
    assert absent_base_checkpoint(peft_config) == str(tmp_path / "no-such-base")
    assert missing_base_checkpoint(peft_config) == (
        f"checkpoint.pretrained_checkpoint={tmp_path / 'no-such-base'} is not on this machine"
    )
    (tmp_path / "no-such-base").mkdir()
    assert absent_base_checkpoint(peft_config) is None and missing_base_checkpoint(peft_config) is None
    peft_config.checkpoint.pretrained_checkpoint = None
    assert absent_base_checkpoint(peft_config) is None
    assert missing_base_checkpoint(peft_config) == "checkpoint.pretrained_checkpoint is not set"
    peft_config.peft = None  # without PEFT, no base checkpoint is no missing one
    assert missing_base_checkpoint(peft_config) is None


def test_a_run_keeps_bridges_check(peft_config):
    with pytest.raises(AssertionError, match="no-such-base does not exist"):
        plan_config(peft_config, world_size=1)


def test_a_plan_does_not_need_the_base_and_keeps_its_path(peft_config, tmp_path):
    before = dict(os.environ)
    plan = plan_config(peft_config, world_size=1, base_checkpoint_needed=False)
    # The tiny model's 4 layers in runs 0, 1, 2-3 (a deepstack merge follows layers 0 and 1): one graph each.
    assert plan.language.enabled and plan.language.graphs == len(plan.language.segments_per_stage[0]) == 3
    assert peft_config.checkpoint.pretrained_checkpoint == str(tmp_path / "no-such-base")
    assert dict(os.environ) == before
    assert not list(tmp_path.glob("no-such-base*"))


def test_a_plan_of_a_peft_recipe_with_no_base_at_all_needs_none(peft_config):
    """No path at all (issue #35: the shipped 1-GPU PEFT recipe names none): a plan does not read the base, so it
    plans, and the config keeps its None; a run keeps Bridge's refusal (``train`` says which setting to give first:
    ``tests/unit/test_bad_configs.py``)."""
    import copy

    peft_config.checkpoint.pretrained_checkpoint = None
    run = copy.deepcopy(peft_config)
    plan = plan_config(peft_config, world_size=1, base_checkpoint_needed=False)
    assert plan.language.enabled and peft_config.checkpoint.pretrained_checkpoint is None
    with pytest.raises(AssertionError, match="PEFT requires a pretrained checkpoint path"):
        plan_config(run, world_size=1)


@pytest.fixture
def tiny_config(tmp_path):
    """The tiny Qwen3-VL recipe with both graphs on, not finalized."""
    cfg = tiny_qwen3_vl_config(checkpoint_dir=str(tmp_path / "ckpt"))
    cfg.model = with_cuda_graphs(cfg.model, language={"enabled": True}, vision={"enabled": True})
    return cfg


def test_one_entry_point_three_ways_one_plan(tiny_config):
    """``plan_config`` is the one way to a plan: on a copy (``train``: the config stays for Bridge's ``pretrain()``),
    in place (``validate``, ``plan``), or on a config Bridge already finalized (the callback); all three give the
    same plan, and the copy leaves the config exactly as it was."""
    import copy

    before = repr(tiny_config)
    environ = dict(os.environ)
    on_copy = plan_config(tiny_config, world_size=1, copy=True)
    assert repr(tiny_config) == before and dict(os.environ) == environ
    in_place = plan_config(tiny_config, world_size=1)
    assert repr(tiny_config) != before  # Bridge's finalization ran on it
    finalized = copy.deepcopy(tiny_config)
    again = plan_config(finalized, world_size=1, finalized=True)
    assert on_copy == in_place == again
    assert on_copy.language.enabled and on_copy.vision is not None and on_copy.vision.enabled
