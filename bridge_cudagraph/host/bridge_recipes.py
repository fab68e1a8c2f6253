"""Bridge's recipe modules, imported without running their package's ``__init__``.

Host change:
  changes: ``sys.modules["megatron.bridge.recipes"]``, a bare package with its ``__init__`` unrun, while that
    package is not imported (:func:`bridge_recipes_without_init`)
  written for: Bridge 0.6.2
  gate: the package not yet imported
  undo: leaving the block
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["BRIDGE_RECIPES", "bridge_recipes_without_init"]


#: The package whose ``__init__`` :func:`bridge_recipes_without_init` leaves unrun.
BRIDGE_RECIPES = "megatron.bridge.recipes"


@contextlib.contextmanager
def bridge_recipes_without_init() -> Iterator[None]:
    """Modules under ``megatron.bridge.recipes`` import in the block without running the package's ``__init__``.

    Patches: ``sys.modules["megatron.bridge.recipes"]``, only while the package is not imported yet: a package module
    made from its real spec (its ``__path__`` is the installed folder) whose ``__init__.py`` is not executed. Why:
    Megatron-Bridge 0.6.2's ``recipes/__init__.py`` star-imports every model family's recipes, and the flux and wan
    ones import ``diffusers``, which the GPU machine's image lacks; a recipe module such as
    ``megatron.bridge.recipes.qwen_vl.h100.qwen3_vl`` imports nothing of those (its own imports, ``recipes.common``
    and ``recipes.utils``, are Bridge's training stack), so Bridge's own recipe function can be imported and called
    unchanged there. Undone when the block is left: the bare package leaves ``sys.modules`` (the submodules imported
    in the block stay, so a later ordinary ``import megatron.bridge.recipes`` runs the real ``__init__`` over them).
    When the package is already imported, nothing is patched.
    """
    import importlib.util
    import sys

    if BRIDGE_RECIPES in sys.modules:
        yield
        return
    spec = importlib.util.find_spec(BRIDGE_RECIPES)
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError(f"{BRIDGE_RECIPES} is not an installed package")
    bare = importlib.util.module_from_spec(spec)  # the module object with __path__ and __spec__; nothing executed
    sys.modules[BRIDGE_RECIPES] = bare
    try:
        yield
    finally:
        if sys.modules.get(BRIDGE_RECIPES) is bare:
            del sys.modules[BRIDGE_RECIPES]
