"""The optimizer host cache's install on the host's real classes, without a GPU.

The step itself is ``tests/gpu/test_optimizer_host_step.py``'s: megatron-core's distributed optimizer and TE's
FusedAdam need CUDA to be built.
"""

from __future__ import annotations

import pytest
import torch  # noqa: F401  (first: Transformer Engine finds NCCL through torch's libraries)


def _bare(cls):
    """An instance of ``cls`` without its ``__init__`` (which allocates on the GPU): the class swap only needs the
    instance layout."""
    return object.__new__(cls)


@pytest.mark.parametrize("which", ["distributed_optimizer", "fused_adam", "chained_optimizer"])
def test_mixins_go_on_and_off_the_host_classes(which):
    """Python refuses a ``__class__`` assignment between layouts that differ; megatron-core's optimizers derive from
    ``ABC``, which a plain mixin breaks (run 34's failure). On and off again: the very host class is back."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    from megatron.core.optimizer.optimizer import ChainedOptimizer
    from transformer_engine.pytorch.optimizers import FusedAdam

    from bridge_cudagraph.host.instance_class import extend_instance_class, restore_instance_class
    from bridge_cudagraph.host.optimizer import CachedAdamLists, CachedChainedStep, CachedShardViews

    pairs = {
        "distributed_optimizer": (DistributedOptimizer, CachedShardViews),
        "fused_adam": (FusedAdam, CachedAdamLists),
        "chained_optimizer": (ChainedOptimizer, CachedChainedStep),
    }
    cls, mixin = pairs[which]
    obj = _bare(cls)
    extend_instance_class(obj, mixin)
    assert isinstance(obj, mixin) and isinstance(obj, cls) and type(obj).__mro__[1] is mixin
    restore_instance_class(obj, mixin)
    assert type(obj) is cls


def test_the_installed_stack_is_the_one_the_mixins_mirror():
    """megatron-core 0.19 and TE 2.20 (pyproject's pins): the cache turns on; :func:`install` refuses silently
    elsewhere (logged), so a drift of these pins would show here first."""
    from bridge_cudagraph.host import compat

    assert compat.optimizer_step_is_mirrored()
