"""The module walk at the end of megatron-core's gradient finalisation, done once instead of on every step.

Host change:
  changes: ``model_config.finalize_model_grads_func``, wrapped (:func:`install`)
  written for: megatron-core 0.19.2 ``finalize_model_grads.py``
  gate: the proven stack (:func:`~bridge_cudagraph.host.compat.check_proven_stack`);
    :func:`~bridge_cudagraph.host.compat.finalize_walk_is_mirrored`; ``model.cuda_graph.cached_walks.grad_finalize``
  undo: :func:`uninstall`

Host change:
  changes: ``megatron.core.distributed.finalize_model_grads.reset_model_temporary_tensors``
    (:func:`listed_reset_modules`, entered around each of one model's ``finalize_model_grads`` calls by the wrapper
    :func:`install` puts on)
  written for: megatron-core 0.19.2
  gate: :func:`~bridge_cudagraph.host.compat.finalize_walk_is_mirrored`
  undo: leaving the block

Why: megatron-core 0.19.2's ``finalize_model_grads`` (finalize_model_grads.py), which the schedule calls after
the last micro-batch's backward (``config.finalize_model_grads_func``, set by Bridge's set-up), ends with
``reset_model_temporary_tensors``: a walk of every module of every chunk (1,028 on Qwen3-VL-2B) that zeroes
MoE routers' per-step tensors. The backward is done and the optimizer has not started, so the GPU has nothing to run
while the host walks: a profile with Python stacks found it the longest GPU-idle stretch of the graphed step. On a
dense model it finds nothing to reset.

What it looks for is fixed when the model is built: an ``expert_bias`` attribute, a ``reset_global_aux_loss_tracker``
method, or a ``qb_beta_accum`` buffer (megatron-core's router sets it in ``__init__``, to a tensor or to None). So the
modules that have one are listed once per model, and every step the host's own function runs on that list
(:func:`listed_reset_modules`): the same resets, in the same order, of the same
tensors. The config's conditions are still the host's, read on every call.

:func:`install` wraps the model config's ``finalize_model_grads_func`` (the narrowest point: this model's calls
only); :func:`uninstall` puts the previous function back.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Iterator
from typing import Any

from bridge_cudagraph.host import compat
from bridge_cudagraph.host.changes import ORIGINAL
from bridge_cudagraph.host.finalize_chain import ChainLink

__all__ = ["install", "installed", "listed_modules", "listed_reset_modules", "uninstall"]

#: The marks of :func:`install`'s wrapper (:class:`~bridge_cudagraph.host.finalize_chain.ChainLink`): a wrapper
#: put on top later (``functools.wraps``, as :func:`bridge_cudagraph.host.replica_sync.install_grad_sync` does)
#: copies them, which is how :func:`install` sees its walk already in the chain.
LINK = ChainLink("_bridge_cudagraph_finalize")
WRAPPED = LINK.wrapped


class _ListedModules:
    """Stands in for one model chunk inside ``reset_model_temporary_tensors``: its ``modules()`` are a list."""

    def __init__(self, modules: list[Any]) -> None:
        self._modules_listed = modules

    def modules(self) -> list[Any]:
        return self._modules_listed


@contextlib.contextmanager
def listed_reset_modules(chunks: list[Any], modules: list[list[Any]]) -> Iterator[None]:
    """While the block runs, megatron-core's ``reset_model_temporary_tensors`` visits ``modules[i]`` for chunk
    ``chunks[i]`` instead of walking ``chunks[i].modules()``; a call for any other model walks as before.

    Patches: ``megatron.core.distributed.finalize_model_grads.reset_model_temporary_tensors`` (megatron-core 0.19.2,
    finalize_model_grads.py), the module-level name ``finalize_model_grads`` calls at its end. Why: it
    walks every module of every chunk on every step while the GPU waits for the optimizer (the module's docstring);
    :func:`listed_modules` lists the modules it can act on once. The host's function still runs, on those modules
    (through :class:`_ListedModules`, which ``get_attr_wrapped_model(chunk, "modules")`` returns as it is). Undone when
    the block is left.
    """
    # The package exports the function finalize_model_grads under its module's name: the module, by its path.
    host: Any = importlib.import_module("megatron.core.distributed.finalize_model_grads")
    original = host.reset_model_temporary_tensors
    ids = [id(chunk) for chunk in chunks]
    listed = [_ListedModules(m) for m in modules]

    def reset_model_temporary_tensors(config: Any, model: list[Any]) -> None:
        if [id(chunk) for chunk in model] == ids:
            return original(config, listed)
        return original(config, model)

    setattr(reset_model_temporary_tensors, ORIGINAL, original)
    host.reset_model_temporary_tensors = reset_model_temporary_tensors
    try:
        yield
    finally:
        host.reset_model_temporary_tensors = original


def _may_reset(module: Any) -> bool:
    """Whether megatron-core 0.19.2's ``reset_model_temporary_tensors`` could act on ``module`` under some config
    (each of its three tests, without the config's half)."""
    return (
        hasattr(module, "expert_bias")
        or hasattr(module, "reset_global_aux_loss_tracker")
        or getattr(module, "qb_beta_accum", None) is not None
    )


def listed_modules(model_chunks: list[Any]) -> list[list[Any]]:
    """Per chunk, in ``modules()`` order, the modules the host's reset could act on."""
    from megatron.core.utils import get_attr_wrapped_model

    return [[m for m in get_attr_wrapped_model(chunk, "modules")() if _may_reset(m)] for chunk in model_chunks]


def install(model_config: Any, model_chunks: list[Any]) -> bool:
    """Wrap ``model_config.finalize_model_grads_func`` so that its calls for ``model_chunks`` reset the listed modules
    without the walk; returns whether a wrapper is in place (not where no function is set yet, or the installed
    megatron-core is not the release the listing mirrors). Idempotent."""
    finalize = getattr(model_config, "finalize_model_grads_func", None)
    if finalize is None or not compat.finalize_walk_is_mirrored():
        return False
    if LINK.in_chain(model_config):
        return True
    chunks = list(model_chunks)
    modules = listed_modules(chunks)

    @functools.wraps(finalize)
    def finalize_with_listed_modules(*args: Any, **kwargs: Any) -> Any:
        with listed_reset_modules(chunks, modules):
            return finalize(*args, **kwargs)

    LINK.put_on(model_config, finalize_with_listed_modules, finalize)
    return True


def installed(model_config: Any) -> bool:
    """Whether :func:`install`'s wrapper is in ``model_config``'s finalisation function (itself, or under a wrapper
    put on top)."""
    return LINK.in_chain(model_config)


def uninstall(model_config: Any) -> bool:
    """Put back the function :func:`install` wrapped; returns whether it did. Where another wrapper was put on top
    since, nothing changes (taking ours out from under it would drop that wrapper too); the listing then stays,
    which steps exactly as the walk does."""
    return LINK.take_off(model_config)
