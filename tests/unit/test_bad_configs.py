"""Every configuration that cannot be graphed is refused at config time, before any GPU or process-group work,
with one line that names the setting and the fix, and leaves the provider as it was.

One table, driven through the entry points a user hits: the provider's ``finalize()`` (what Bridge's
``ConfigContainer.validate`` calls), the strict block loader, the run-level check on a whole ``ConfigContainer``,
``build_plan`` for the layout arithmetic, and the ``train`` guard on a machine without CUDA.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bridge_cudagraph.config import CudaGraphConfigError, cuda_graph_config_from_dict
from bridge_cudagraph.examples import tiny
from bridge_cudagraph.layout import LayoutError
from bridge_cudagraph.strict import UnknownKeyError


def _vl(block=None, **fields):
    return tiny.tiny_qwen3_vl_provider(cuda_graph_config_from_dict(block) if block else None, **fields)


def _gpt(block=None, **fields):
    return tiny.tiny_gpt_provider(cuda_graph_config_from_dict(block) if block else None, **fields)


LANG = {"language": {"enabled": True}}
VIS = {"vision": {"enabled": True}}
BOTH = {**LANG, **VIS}

# (id, provider factory, fragments the one-line message must contain)
FINALIZE_CASES = [
    (
        "full-recompute",
        lambda: _gpt(LANG, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
        ["recompute_granularity='full'", "selective"],
    ),
    ("variable-seq-lengths", lambda: _gpt(LANG, variable_seq_lengths=True), ["variable_seq_lengths", "pad"]),
    (
        "virtual-pipeline-qwen3-vl",
        lambda: _vl(LANG, virtual_pipeline_model_parallel_size=2, pipeline_model_parallel_size=2),
        ["virtual_pipeline", "null"],
    ),
    (
        "moe-whole-layers",
        lambda: tiny.tiny_qwen3_vl_provider(cuda_graph_config_from_dict(LANG), moe=True),
        ["whole MoE layers", "moe_router"],
    ),
    (
        "fp16-vision",
        lambda: _vl(VIS, fp16=True, bf16=False, params_dtype=torch.float16, pipeline_dtype=torch.float16),
        ["fp16", "bf16"],
    ),
    (
        "upstream-language-switch",
        lambda: _gpt(None, cuda_graph_impl="transformer_engine"),
        ["cuda_graph_impl", "cuda_graph.language.enabled=true"],
    ),
    (
        "upstream-vision-switch",
        lambda: _vl(None, vision_cuda_graph_impl="transformer_engine"),
        ["vision_cuda_graph_impl", "cuda_graph.vision.enabled=true"],
    ),
    ("vision-on-gpt", lambda: _gpt(VIS), ["no vision encoder", "false"]),
    ("vision-tp-vs-heads", lambda: _vl({"vision": {"tensor_parallel_size": 3}}), ["4 attention heads", "divisor"]),
    (
        "vision-tp-vs-language-tp",
        lambda: _vl({"vision": {"tensor_parallel_size": 2}}),
        ["does not divide model.tensor_model_parallel_size=1"],
    ),
    (
        "budget-below-smallest-image",
        lambda: _vl({"vision": {"enabled": True, "token_budgets": [2, 64]}}),
        ["smaller than the smallest image", "4 patches"],
    ),
    (
        "budget-in-merged-units",
        lambda: _vl({"vision": {"enabled": True, "token_budgets": [64, 1022]}}),
        ["not a multiple of spatial_merge_size**2", "patches, not merged tokens"],
    ),
]

BLOCK_CASES = [
    ("vision-modules", {"vision": {"modules": ["attn"]}}, CudaGraphConfigError, ["vision.modules", "null"]),
    ("budgets-not-sorted", {"vision": {"token_budgets": [4096, 1024]}}, CudaGraphConfigError, ["ascending"]),
    ("unknown-module", {"language": {"modules": ["attention"]}}, CudaGraphConfigError, ["allowed"]),
    ("moe-and-router", {"language": {"modules": ["moe", "moe_router"]}}, CudaGraphConfigError, ["keep one"]),
    ("bad-on-capture-error", {"on_capture_error": "skip"}, CudaGraphConfigError, ["'eager' or 'raise'"]),
    ("unknown-key", {"vision": {"token_budget": [64]}}, UnknownKeyError, ["token_budget", "'token_budgets'"]),
    ("wrong-type", {"vision": {"tensor_parallel_size": "2"}}, CudaGraphConfigError, ["integer"]),
    ("wrong-bool", {"language": {"enabled": "yes"}}, CudaGraphConfigError, ["true or false"]),
]


def _untouched() -> bool:
    from bridge_cudagraph.testing.world import parallel_state_untouched

    return parallel_state_untouched() and not torch.distributed.is_initialized()


def _one_line(record, error: BaseException, fragments: list[str]) -> None:
    """The refusal is one line holding every fragment; recorded (``BRIDGE_CUDAGRAPH_RESULTS``) as the user sees it."""
    text = str(error)
    record(error=type(error).__name__, message=text)
    assert "\n" not in text, text
    for fragment in fragments:
        assert fragment in text, (fragment, text)


@pytest.mark.parametrize(("name", "make", "fragments"), FINALIZE_CASES, ids=[c[0] for c in FINALIZE_CASES])
def test_finalize_refuses(name, make, fragments, record):
    provider = make()
    before = {f.name: getattr(provider, f.name) for f in dataclasses.fields(provider) if f.name != "cuda_graph"}
    with pytest.raises((CudaGraphConfigError, LayoutError)) as info:  # the heads check is the layout's one copy
        provider.finalize()
    _one_line(record, info.value, fragments)
    after = {f.name: getattr(provider, f.name) for f in dataclasses.fields(provider) if f.name != "cuda_graph"}
    changed = {k for k in before if not (before[k] is after[k] or before[k] == after[k])}
    assert not changed, f"a refused config changed {changed}"
    assert _untouched()


@pytest.mark.parametrize(("name", "block", "error", "fragments"), BLOCK_CASES, ids=[c[0] for c in BLOCK_CASES])
def test_the_block_loader_refuses(name, block, error, fragments, record):
    with pytest.raises(error) as info:
        cuda_graph_config_from_dict(block, "model.cuda_graph")
    _one_line(record, info.value, fragments)
    assert _untouched()


def test_expandable_segments_without_nccl_graph_register_is_refused(monkeypatch, record):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.delenv("NCCL_GRAPH_REGISTER", raising=False)
    with pytest.raises(CudaGraphConfigError) as info:
        _vl(BOTH).finalize()
    _one_line(record, info.value, ["expandable_segments", "NCCL_GRAPH_REGISTER=0"])
    monkeypatch.setenv("NCCL_GRAPH_REGISTER", "0")
    _vl(BOTH).finalize()


def test_graphs_get_the_te_rng_tracker_they_need():
    """Graphs without TE's graph-safe RNG tracker fail at capture ('Tensor' has no 'get_state'): it is switched on."""
    provider = _vl(BOTH, use_te_rng_tracker=False)
    provider.finalize()
    assert provider.use_te_rng_tracker


@pytest.fixture
def run_config(tmp_path):
    from megatron.bridge.training.config import runtime_config_update

    from bridge_cudagraph.examples.tiny_recipe import tiny_qwen3_vl_config

    cfg = tiny_qwen3_vl_config(checkpoint_dir=str(tmp_path / "ckpt"))
    cfg.model.cuda_graph = cuda_graph_config_from_dict(BOTH)
    runtime_config_update(cfg)
    return cfg


RUN_CASES = [
    ("dataloader-batch", {"dataloader_type": "batch"}, ["dataloader_type='batch'", "single"]),
    ("in-batch-packing", {"enable_in_batch_packing": True}, ["enable_in_batch_packing", "pad_to_max_length=true"]),
    ("no-padding", {"pad_to_max_length": False}, ["pad_to_max_length=false", "pad_to_max_length=true"]),
    ("seq-mismatch", {"seq_length": 512}, ["512 != model.seq_length 256", "equal"]),
]


@pytest.mark.parametrize(("name", "dataset", "fragments"), RUN_CASES, ids=[c[0] for c in RUN_CASES])
def test_run_level_check_refuses(run_config, name, dataset, fragments, record):
    from bridge_cudagraph.validation import check_run

    for key, value in dataset.items():
        object.__setattr__(run_config.dataset, key, value)
    with pytest.raises(CudaGraphConfigError) as info:
        check_run(run_config)
    _one_line(record, info.value, fragments)
    assert _untouched()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_train_with_graphs_on_a_cpu_machine_is_refused(run_config, record):
    from bridge_cudagraph.validation import check_can_train_with_graphs

    with pytest.raises(CudaGraphConfigError) as info:
        check_can_train_with_graphs(run_config)
    _one_line(record, info.value, ["no CUDA device", "plan"])


def test_layout_that_does_not_divide_the_world_is_refused(record):
    from bridge_cudagraph.plan import build_plan, model_facts

    provider = _vl(BOTH, tensor_model_parallel_size=4, context_parallel_size=2, pipeline_model_parallel_size=1)
    with pytest.raises(LayoutError) as info:
        build_plan(model_facts(provider), provider.cuda_graph, world_size=12, micro_batch_size=1, global_batch_size=8)
    _one_line(record, info.value, ["tp 4 x cp 2 x pp 1 = 8 does not divide world size 12"])
    assert _untouched()


def _mismatched_groups(rank: int, world: int) -> str:
    from bridge_cudagraph.capture.common import CaptureError, check_group_sizes
    from bridge_cudagraph.groups import build_collections
    from bridge_cudagraph.layout import ParallelLayout

    pgc = build_collections(ParallelLayout(), None, backend="gloo")["language"]
    config = _gpt(LANG, tensor_model_parallel_size=2)
    try:
        check_group_sizes(config, pgc, "language")
    except CaptureError as error:
        return str(error)
    return "accepted"


@pytest.mark.slow
def test_collection_that_disagrees_with_the_config_is_refused_before_capture(record):
    from _dist import run_world

    (message,) = run_world(1, _mismatched_groups)
    record(error="CudaGraphConfigError", message=message)
    assert "config.tensor_model_parallel_size = 2 but its process-group collection has a group of size 1" in message
