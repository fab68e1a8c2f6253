"""Bridge's compilation of megatron-core's dataset helpers, replaced by an import of the prebuilt module where the
install ships no Makefile.

Host change:
  changes: ``megatron.bridge.training.initialize.compile_helpers`` (:func:`use_prebuilt_dataset_helpers`)
  written for: megatron-core 0.19.2 wheels under Bridge 0.6.2
  gate: :func:`~bridge_cudagraph.host.compat.dataset_helpers_prebuilt_without_makefile`
  undo: :func:`restore_dataset_helpers`
"""

from __future__ import annotations

import importlib

from bridge_cudagraph.host import compat
from bridge_cudagraph.host.changes import ORIGINAL

__all__ = ["restore_dataset_helpers", "use_prebuilt_dataset_helpers"]


def use_prebuilt_dataset_helpers() -> bool:
    """Rebind Bridge's ``megatron.bridge.training.initialize.compile_helpers`` to an import of the prebuilt module,
    when :func:`~bridge_cudagraph.host.compat.dataset_helpers_prebuilt_without_makefile` says the install needs it.

    Why: megatron-core's PyPI wheels (0.19.2 seen) ship the compiled ``megatron.core.datasets.helpers_cpp`` but not
    the Makefile that Bridge 0.6.2's ``initialize_megatron`` runs ``make -C`` on, so every Bridge run on such an
    install ``sys.exit(1)``s during set-up ("Failed to compile the C++ dataset helper functions"). A source install
    (NGC) keeps Bridge's behaviour: nothing is patched. Undone by :func:`restore_dataset_helpers`; the ``train`` verb
    leaves it for the life of the process. Idempotent.

    Returns:
        Whether Bridge's ``compile_helpers`` is the replacement now.
    """
    from megatron.bridge.training import initialize

    if getattr(initialize.compile_helpers, ORIGINAL, None) is not None:
        return True
    if not compat.dataset_helpers_prebuilt_without_makefile():
        return False

    def compile_helpers() -> None:
        importlib.import_module("megatron.core.datasets.helpers_cpp")

    setattr(compile_helpers, ORIGINAL, initialize.compile_helpers)
    initialize.compile_helpers = compile_helpers
    return True


def restore_dataset_helpers() -> None:
    """Undo :func:`use_prebuilt_dataset_helpers`: Bridge's own ``compile_helpers`` is back."""
    from megatron.bridge.training import initialize

    original = getattr(initialize.compile_helpers, ORIGINAL, None)
    if original is not None:
        initialize.compile_helpers = original
