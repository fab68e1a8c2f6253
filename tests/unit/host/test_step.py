"""step_host: each setting of ``model.cuda_graph.forward`` and ``model.cuda_graph.cached_walks`` puts on its own
host changes and no other, as the plan resolves it.

On the CPU: the classes are Bridge 0.6.2's ``Qwen3VLModel`` and ``Qwen3VLTransformerBlock``, megatron-core's
``DistributedOptimizer`` and Transformer Engine's ``FusedAdam``, as bare instances (their ``__init__`` builds TE layers
or needs a GPU): what :func:`bridge_cudagraph.host.step.install_planned` puts on a class, and which hooks, does not
depend on the layers inside. What each mixin then computes is ``tests/unit/host/test_forward.py``'s and the GPU
tests'.
"""

from __future__ import annotations

import pytest
import torch

from bridge_cudagraph.config import (
    CACHED_WALKS,
    FORWARD_PARTS,
    CachedWalksConfig,
    CudaGraphConfig,
    ForwardConfig,
    LanguageGraphConfig,
    VisionGraphConfig,
)
from bridge_cudagraph.examples import tiny
from bridge_cudagraph.host import finalize as finalize_host
from bridge_cudagraph.host import forward as forward_host
from bridge_cudagraph.host import optimizer as optimizer_host
from bridge_cudagraph.host import step as step_host
from bridge_cudagraph.testing.plans import plan_for


def _bare(cls: type) -> torch.nn.Module:
    module = cls.__new__(cls)
    torch.nn.Module.__init__(module)
    return module


def _qwen3_vl() -> torch.nn.Module:
    """A first-stage ``Qwen3VLModel`` with its encoder, input embedding and deepstack decoder: what the mixins and
    their hooks go on."""
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.model import Qwen3VLModel
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.transformer_block import Qwen3VLTransformerBlock

    model = _bare(Qwen3VLModel)
    model.pre_process = True
    model.vision_model = torch.nn.Module()
    model.language_model = torch.nn.Module()
    model.language_model.embedding = torch.nn.Module()
    model.language_model.decoder = _bare(Qwen3VLTransformerBlock)
    return model


def _plan(forward: dict | None = None, cached_walks: dict | None = None):
    cfg = CudaGraphConfig(
        language=LanguageGraphConfig(enabled=True),
        vision=VisionGraphConfig(enabled=True),
        forward=ForwardConfig(**(forward or {})),
        cached_walks=CachedWalksConfig(**(cached_walks or {})),
    )
    return plan_for(tiny.tiny_qwen3_vl_provider(cfg), world_size=1, micro_batch_size=2, num_microbatches=1)


def _mixins(model: torch.nn.Module) -> set[type]:
    objects = (model, model.language_model.decoder)
    return {
        mixin
        for mixins in forward_host.MECHANISMS.values()
        for mixin in mixins
        if any(isinstance(o, mixin) for o in objects)
    }


def test_the_mechanisms_name_every_mixin_once():
    """One setting per mechanism: each mixin belongs to exactly one part, and the parts are the block's."""
    assert tuple(forward_host.MECHANISMS) == FORWARD_PARTS
    mixins = [m for ms in forward_host.MECHANISMS.values() for m in ms]
    assert len(mixins) == len(set(mixins)) == 5


@pytest.mark.parametrize("part", FORWARD_PARTS)
def test_each_forward_setting_leaves_its_own_part_to_bridge(part):
    """``forward.<part>: false`` keeps that part's mixins (and hooks) off the model and puts every other one on
    (``positions: false`` takes the flat rows with it: they carry its positions); uninstall restores the classes."""
    model = _qwen3_vl()
    classes = (type(model), type(model.language_model.decoder))
    plan = _plan(forward={part: False}, cached_walks=dict.fromkeys(CACHED_WALKS, False))
    installed = step_host.install_planned(plan, [model], None)
    try:
        off = {part, "flat_rows"} if part == "positions" else {part}
        expected = {m for name, ms in forward_host.MECHANISMS.items() if name not in off for m in ms}
        assert _mixins(model) == expected
        hooked = {mixin for _, mixin, _ in installed.forward.hooks}  # the embedding's and the encoder's
        assert hooked == {forward_host.MIXINS[name] for name in ("CpuRopeIndex", "RowMerge")} & expected
        assert not installed.optimizer and installed.finalize_config is None
    finally:
        step_host.uninstall(installed)
    assert (type(model), type(model.language_model.decoder)) == classes and _mixins(model) == set()
    assert installed.forward.hooks == []


def test_every_forward_part_on_by_default_and_none_on_a_graphless_plan():
    model = _qwen3_vl()
    installed = step_host.install_planned(_plan(cached_walks=dict.fromkeys(CACHED_WALKS, False)), [model], None)
    try:
        assert _mixins(model) == {m for ms in forward_host.MECHANISMS.values() for m in ms}
    finally:
        step_host.uninstall(installed)
    graphless = plan_for(tiny.tiny_qwen3_vl_provider(CudaGraphConfig()), world_size=1, micro_batch_size=2,
                         num_microbatches=1)  # fmt: skip
    installed = step_host.install_planned(graphless, [model], None)
    assert _mixins(model) == set() and installed.forward.pairs == []


@pytest.mark.parametrize(
    "walks", [{}, {"optimizer": False}, {"grad_finalize": False}, dict.fromkeys(CACHED_WALKS, False)]
)
def test_each_cached_walk_is_its_own_setting(walks):
    """``cached_walks.optimizer`` puts the optimizer's mixins on, ``cached_walks.grad_finalize`` wraps the model
    config's finalisation function; each without the other."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    from transformer_engine.pytorch.optimizers import FusedAdam

    def finalize(*args, **kwargs):  # stands in for Bridge's partial(finalize_model_grads, ...)
        return None

    provider = tiny.tiny_qwen3_vl_provider(None)
    provider.finalize_model_grads_func = finalize
    chunk = torch.nn.Module()
    chunk.config = provider
    optimizer = object.__new__(DistributedOptimizer)
    optimizer.optimizer = object.__new__(FusedAdam)
    plan = _plan(forward=dict.fromkeys(FORWARD_PARTS, False), cached_walks=walks)
    installed = step_host.install_planned(plan, [chunk], optimizer)
    try:
        assert optimizer_host.installed(optimizer) is ("optimizer" not in walks)
        assert finalize_host.installed(provider) is ("grad_finalize" not in walks)
        assert (provider.finalize_model_grads_func is finalize) is ("grad_finalize" in walks)
    finally:
        step_host.uninstall(installed)
    assert type(optimizer) is DistributedOptimizer and provider.finalize_model_grads_func is finalize
