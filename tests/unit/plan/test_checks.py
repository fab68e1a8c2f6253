"""``bridge_cudagraph.plan.checks``: the checks made before Bridge's own finalization agree with Bridge's (each
refuses what Bridge refuses, naming the setting, and nothing Bridge accepts), and the data path's image cap is read
where Bridge's collate and the processor folder keep it."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest

from bridge_cudagraph.config import CudaGraphConfigError
from bridge_cudagraph.plan.checks import check_before_bridge
from bridge_cudagraph.plan.facts import image_facts


# --------------------------------------------------------------------------------------- the data path's images
def _processor_folder(tmp_path, **settings):
    folder = tmp_path / "processor"
    folder.mkdir()
    (folder / "preprocessor_config.json").write_text(json.dumps(settings))
    return str(folder)


def _config(**dataset):
    return SimpleNamespace(dataset=SimpleNamespace(**dataset))


def test_bridges_qwen_vl_collate_caps_the_pixels_it_passes_the_processor():
    """The number is read off Bridge's own collate (its signature's defaults), the very constant Bridge defines."""
    from megatron.bridge.models.qwen_vl.data.collate_fn import QWEN_VL_MAX_PIXELS, QWEN_VL_MIN_PIXELS

    from bridge_cudagraph.plan.facts import _collate_pixels

    assert (QWEN_VL_MAX_PIXELS, QWEN_VL_MIN_PIXELS) == (1003520, 200704)
    qwen = ("qwen2_5_collate_fn", QWEN_VL_MAX_PIXELS, QWEN_VL_MIN_PIXELS)
    assert _collate_pixels("Qwen3VLProcessor") == _collate_pixels("Qwen2_5_VLProcessor") == qwen
    assert _collate_pixels("NoSuchProcessor") == ("", None, None)
    # Bridge's Gemma 3 collate passes max_pixels only when given one (default None): no cap of its own.
    assert _collate_pixels("Gemma3Processor")[1:] == (None, None)


def test_a_qwen3_vl_processor_folder_gets_the_collates_cap_not_its_own(tmp_path):
    """The collate passes min_pixels and max_pixels with every call, which override the folder's size."""
    path = _processor_folder(
        tmp_path, processor_class="Qwen3VLProcessor", size={"longest_edge": 16777216, "shortest_edge": 65536}
    )
    facts = image_facts(_config(hf_processor_path=path))
    assert (facts.max_pixels, facts.source) == (
        1003520,
        "passed to the processor by Bridge's collate, qwen2_5_collate_fn",
    )


def test_a_processor_whose_collate_passes_no_cap_gets_its_own(tmp_path):
    path = _processor_folder(tmp_path, processor_class="Gemma3Processor", size={"longest_edge": 802816})
    facts = image_facts(_config(hf_processor_path=path))
    assert facts.max_pixels == 802816
    assert facts.source == f"size.longest_edge of {path}'s preprocessor_config.json"
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "preprocessor_config.json").write_text(json.dumps({"processor_class": "Gemma3Processor"}))
    nothing = image_facts(_config(hf_processor_path=str(bare)))
    assert nothing.max_pixels is None and "no max_pixels in reach" in nothing.source


def test_no_processor_an_energon_cap_and_a_folder_not_on_this_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    none = image_facts(_config(hf_processor_path=None))
    assert (none.max_pixels, none.source) == (None, "the dataset names no processor (dataset.hf_processor_path)")
    energon = image_facts(_config(task_encoder=SimpleNamespace(max_pixels=802816, hf_processor_path="Org/Name")))
    assert (energon.max_pixels, energon.source) == (802816, "dataset.task_encoder.max_pixels")
    # A Hub id that is not in the cache: a Qwen3-VL checkpoint's processor, whose collate is Bridge's Qwen-VL one.
    remote = image_facts(_config(hf_processor_path="Qwen/Qwen3-VL-8B-Instruct"))
    assert remote.max_pixels == 1003520


# --------------------------------------------------------------------------------- the same refusals as Bridge
@pytest.fixture(scope="module")
def photo_config(tmp_path_factory):
    """The photo recipe's function (Bridge's DirectHFSFTDatasetConfig, a fine-tuning dataset), graphs off."""
    from bridge_cudagraph.examples.photo_recipe import tiny_qwen3_vl_photos_config

    return tiny_qwen3_vl_photos_config(cache=tmp_path_factory.mktemp("photos"))


@pytest.fixture(scope="module")
def gpt_sft_config(tmp_path_factory):
    """The tiny GPT on Bridge's GPT SFT dataset (GPTSFTDatasetConfig, a fine-tuning dataset), graphs off."""
    from bridge_cudagraph.examples.gpt_packed_recipe import tiny_gpt_packed_config

    return tiny_gpt_packed_config(cache=tmp_path_factory.mktemp("gpt_packed"))


#: Changes to the photo config (Qwen3-VL, whose provider turns calculate_per_token_loss on itself under cp > 1) or
#: the GPT SFT config: (model, ddp, dataset) settings.
BRIDGE_CASES = {
    "as-is": ({}, {}, {}),
    "seq-lengths-differ": ({}, {}, {"seq_length": 1024}),
    "cp-per-token-loss-off": ({"context_parallel_size": 2}, {"average_in_collective": False}, {}),
    "cp-average-in-collective": ({"context_parallel_size": 2, "calculate_per_token_loss": True}, {}, {}),
    "cp-both-right": (
        {"context_parallel_size": 2, "calculate_per_token_loss": True},
        {"average_in_collective": False},
        {},
    ),
    "cp-seq-not-a-multiple": (
        {"context_parallel_size": 2, "calculate_per_token_loss": True, "seq_length": 2046},
        {"average_in_collective": False},
        {"seq_length": 2046},
    ),
}


@pytest.mark.parametrize("recipe", ["photos", "gpt-sft"])
@pytest.mark.parametrize("case", sorted(BRIDGE_CASES))
def test_the_checks_before_bridge_refuse_exactly_what_bridge_refuses(request, recipe, case, monkeypatch):
    """Each case through ours and through Bridge's ``runtime_config_update`` alone: both accept, or both refuse (ours
    with one line naming the setting)."""
    from megatron.bridge.training.config import runtime_config_update

    model, ddp, dataset = BRIDGE_CASES[case]
    base = request.getfixturevalue("photo_config" if recipe == "photos" else "gpt_sft_config")
    cfg = copy.deepcopy(base)
    for target, changes in ((cfg.model, model), (cfg.ddp, ddp), (cfg.dataset, dataset)):
        for key, value in changes.items():
            setattr(target, key, value)
    monkeypatch.setenv("WORLD_SIZE", str(cfg.model.context_parallel_size))
    try:
        check_before_bridge(copy.deepcopy(cfg))
        ours = None
    except CudaGraphConfigError as error:
        ours = str(error)
    try:
        runtime_config_update(cfg)
        bridges = None
    except (AssertionError, ValueError) as error:
        bridges = str(error)
    assert (ours is None) == (bridges is None), (ours, bridges)
    if ours is not None:
        assert "\n" not in ours and any(
            setting in ours
            for setting in ("dataset.seq_length", "model.calculate_per_token_loss", "ddp.average_in_collective")
        ), ours
        assert "model.seq_length" in ours or "model.context_parallel_size" in ours
