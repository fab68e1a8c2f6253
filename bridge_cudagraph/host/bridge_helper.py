"""Bridge's language graph helper, rebound so that Bridge does not capture the language layers a second time.

Host change:
  changes: ``megatron.bridge.training.train.TECudaGraphHelper`` (:func:`rebind_bridge_helper`; the class it rebinds
    to is :mod:`bridge_cudagraph.bridge.loop`'s, passed in, so this module imports nothing of the plugin's loop)
  written for: Bridge 0.6.2
  gate: :func:`~bridge_cudagraph.host.compat.bridge_builds_language_helper_by_name`
  undo: :func:`uninstall_bridge_helper`
"""

from __future__ import annotations

from collections.abc import Callable

from bridge_cudagraph.host import compat
from bridge_cudagraph.host.changes import ORIGINAL

__all__ = ["bridge_helper_installed", "rebind_bridge_helper", "uninstall_bridge_helper"]


def rebind_bridge_helper(dispatching: Callable[[type], type]) -> None:
    """Rebind ``megatron.bridge.training.train.TECudaGraphHelper`` to ``dispatching(real)``, the class
    :func:`bridge_cudagraph.bridge.loop.dispatching_class` makes (idempotent).

    Patches: the module-level name through which Bridge 0.6.2's ``train()`` builds its language graph helper at call
    time (``train.py``; :func:`~bridge_cudagraph.host.compat.bridge_builds_language_helper_by_name` probes it).
    Why: a ``bridge_cudagraph`` provider keeps ``cuda_graph_impl="transformer_engine"`` (it routes replay to the TE
    graphs), so Bridge would capture the language layers a second time with megatron-core's helper (no mRoPE); the
    dispatching class answers for our providers with a callback-owned stand-in and builds the real helper for any
    other config (``bridge_loop``'s docstring). Undone by :func:`uninstall_bridge_helper`; the ``train`` verb leaves
    it installed for the life of the process.

    Raises:
        RuntimeError: This Bridge does not build its helper through that name, so rebinding it could not prevent a
            second capture.
    """
    train = compat.bridge_train_module()
    if bridge_helper_installed():
        return
    if not compat.bridge_builds_language_helper_by_name():
        raise RuntimeError(
            "bridge_cudagraph cannot keep Megatron-Bridge from capturing language graphs itself: this Bridge "
            f"(installed {compat.installed_version('megatron-bridge')}, "
            f"tested {compat.TESTED_STACK['megatron-bridge']}) no longer builds them through "
            "megatron.bridge.training.train.TECudaGraphHelper"
        )
    real = train.TECudaGraphHelper
    replacement = dispatching(real)
    setattr(replacement, ORIGINAL, real)
    train.TECudaGraphHelper = replacement


def bridge_helper_installed() -> bool:
    """Whether :func:`rebind_bridge_helper` is in effect."""
    return getattr(compat.bridge_train_module().TECudaGraphHelper, ORIGINAL, None) is not None


def uninstall_bridge_helper() -> None:
    """Undo :func:`rebind_bridge_helper`: Bridge's name holds megatron-core's ``TECudaGraphHelper`` again."""
    train = compat.bridge_train_module()
    original = getattr(train.TECudaGraphHelper, ORIGINAL, None)
    if original is not None:
        train.TECudaGraphHelper = original
