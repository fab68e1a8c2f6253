"""The vision replicas' gradient average, put after megatron-core's gradient finalisation.

Host change:
  changes: ``model_config.finalize_model_grads_func`` (set by Bridge's set-up), wrapped so the vision encoder's
    gradients are averaged over its replica group after Megatron's own finalisation
  written for: megatron-core 0.19.2 ``finalize_model_grads``, Bridge 0.6.2 ``setup.py``
  gate: the proven stack (:func:`bridge_cudagraph.host.compat.check_proven_stack`); a replica group of more than one
    rank (vision TP below language TP)
  undo: :func:`uninstall_grad_sync`

With vision TP smaller than language TP the language TP group holds copies of every vision shard
(:mod:`bridge_cudagraph.vision.replicas`), whose gradients differ by kernel noise; averaging them before the optimizer
computes the grad norm keeps the copies one model. The provider installs it where it builds the model, graphs on or
off alike, and keeps it for the model's life; :func:`uninstall_grad_sync` puts back the very function it wrapped.
"""

from __future__ import annotations

import functools
from typing import Any

from bridge_cudagraph.host.finalize_chain import ChainLink
from bridge_cudagraph.vision.replicas import average_replica_grads, replica_group_of

__all__ = ["WRAPPED", "grad_sync_installed", "install_grad_sync", "uninstall_grad_sync"]

#: The marks of :func:`install_grad_sync`'s wrapper (:class:`~bridge_cudagraph.host.finalize_chain.ChainLink`); a
#: wrapper put on top later (``functools.wraps``) copies them, so :func:`install_grad_sync` sees the average already in
#: the chain.
LINK = ChainLink("_bridge_cudagraph_replica_sync")
WRAPPED = LINK.wrapped


def install_grad_sync(model_config: Any, model_chunks: list[Any], encoder_type: type[Any]) -> bool:
    """Wrap ``model_config.finalize_model_grads_func`` (set by Bridge's set-up, or by a harness) so the vision
    encoder's gradients are averaged over its replica group after Megatron's own finalisation, before the
    optimizer computes the grad norm. Idempotent; returns whether a wrapper is in place.

    ``encoder_type`` is the class of the encoder to find in ``model_chunks`` (with a ``pg_collection``:
    :class:`bridge_cudagraph.vision.encoder.GraphedQwen3VLVisionModel`), passed in so that this module does not
    import the encoder."""
    encoders = [m for chunk in model_chunks for m in chunk.modules() if isinstance(m, encoder_type)]
    if not encoders:
        return False
    group = replica_group_of(encoders[0].pg_collection)
    finalize = model_config.finalize_model_grads_func
    if group is None or finalize is None:
        return False
    if LINK.in_chain(model_config):
        return True

    @functools.wraps(finalize)
    def finalize_and_sync(*args, **kwargs):
        result = finalize(*args, **kwargs)
        average_replica_grads(encoders[0], group)
        return result

    LINK.put_on(model_config, finalize_and_sync, finalize)
    return True


def grad_sync_installed(model_config: Any) -> bool:
    """Whether the average is in ``model_config``'s finalisation function (itself, or under a wrapper on top)."""
    return LINK.in_chain(model_config)


def uninstall_grad_sync(model_config: Any) -> bool:
    """Put back the function :func:`install_grad_sync` wrapped; returns whether it did. Where another wrapper was put
    on top since, nothing changes (taking ours out from under it would drop that wrapper too). Assigned past any
    ``__setattr__`` of the config's class: the provider's re-installs the average on every assignment."""
    return LINK.take_off(model_config, past_setattr=True)
