"""Bridge's training loop, wrapped so that the CUDA graphs are released when it raises, before Bridge aborts the
process groups.

Host change:
  changes: ``megatron.bridge.training.pretrain.train`` (:func:`release_graphs_if_training_raises`)
  written for: Bridge 0.6.2
  gate: ``train``'s own loop
  undo: leaving the ``with`` block
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
from collections.abc import Iterator
from typing import Any

from bridge_cudagraph.host.changes import ORIGINAL

__all__ = ["release_graphs_if_training_raises"]


logger = logging.getLogger("bridge_cudagraph")


def _bridge_pretrain_module() -> Any:
    """``megatron.bridge.training.pretrain``, whose ``_pretrain`` calls the loop by its module-level name ``train``."""
    return importlib.import_module("megatron.bridge.training.pretrain")


@contextlib.contextmanager
def release_graphs_if_training_raises(owner: Any, module: Any = None) -> Iterator[None]:
    """While active, Bridge's ``_pretrain`` runs its training loop through a wrapper that, when the loop raises
    (any ``BaseException``: an error, ``KeyboardInterrupt``, Bridge's own ``sys.exit`` of its early-exit path), calls
    ``owner.release_graphs(reason=...)`` and re-raises the same exception.

    Patches: ``megatron.bridge.training.pretrain.train`` (Bridge 0.6.2), the name ``_pretrain`` calls the loop by,
    looked up at call time. Why: ``_pretrain`` catches whatever the loop raises and aborts the process groups before
    re-raising (``pretrain.py``, ``_cleanup_after_pretrain_failure``), and no callback event fires on that
    path; graphs still alive then hold NCCL buffers across the abort. Undone when the block is left (the original
    function is put back if the name still holds the wrapper). If this Bridge no longer has that name, a warning says
    so and nothing is patched: only :func:`bridge_cudagraph.bridge.train.run`'s own ``except`` (after Bridge's
    clean-up) releases the graphs.

    Args:
        owner: Anything with ``release_graphs(reason=...)`` (a
        :class:`~bridge_cudagraph.bridge.callback.CudaGraphCallback`).
        module: The module whose ``train`` to wrap; default Bridge's ``pretrain`` module.
    """
    module = _bridge_pretrain_module() if module is None else module
    real = getattr(module, "train", None)
    if not callable(real):
        logger.warning(
            "bridge_cudagraph: %s has no training loop named 'train' to wrap; if training raises, its CUDA graphs "
            "are deleted only after Megatron-Bridge has aborted the process groups",
            getattr(module, "__name__", module),
        )
        yield
        return

    @functools.wraps(real)
    def train(*args: Any, **kwargs: Any) -> Any:
        try:
            return real(*args, **kwargs)
        except BaseException as error:
            try:
                owner.release_graphs(reason=f"training loop raised {type(error).__name__}")
            except Exception:  # the original error is what the user must see
                logger.exception("bridge_cudagraph: releasing the CUDA graphs after a training failure failed")
            raise

    setattr(train, ORIGINAL, real)
    module.train = train
    try:
        yield
    finally:
        if getattr(module, "train", None) is train:
            module.train = real
