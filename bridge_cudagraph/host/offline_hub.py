"""``huggingface_hub`` offline, answering from a Hub-cache folder, for the length of a block.

Host change:
  changes: ``huggingface_hub.constants.HF_HUB_OFFLINE`` / ``HF_HUB_CACHE`` and three environment variables
    (:func:`offline_hub`)
  written for: huggingface_hub (any)
  gate: a recipe with ``hf_config`` (offline config reads)
  undo: leaving the block
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

__all__ = ["offline_hub"]


@contextlib.contextmanager
def offline_hub(cache: str | os.PathLike[str]) -> Iterator[None]:
    """``huggingface_hub`` offline, answering from the Hub-cache folder ``cache``, for the duration of the block.

    Patches: ``huggingface_hub.constants.HF_HUB_OFFLINE`` and ``HF_HUB_CACHE`` (any huggingface_hub: they are read
    once, at import, from the environment), and the environment variables ``HF_HUB_OFFLINE``, ``HF_HUB_CACHE`` and
    ``MEGATRON_CONFIG_LOCK_DIR`` (for code that reads them at call time, and for child processes). Why: setting the
    environment alone is not enough, because ``megatron.bridge`` imports ``huggingface_hub`` long before a recipe
    runs; a Hub lookup then retries the unreachable Hub for ~100 s and fails. Undone when the block is left: the
    constants get their previous values and each variable its previous value or its absence.
    """
    from huggingface_hub import constants

    cache = str(cache)
    names = ("HF_HUB_OFFLINE", "HF_HUB_CACHE", "MEGATRON_CONFIG_LOCK_DIR")
    saved_env = {k: os.environ.get(k) for k in names}
    saved = (constants.HF_HUB_OFFLINE, constants.HF_HUB_CACHE)
    os.environ.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=cache, MEGATRON_CONFIG_LOCK_DIR=cache)
    constants.HF_HUB_OFFLINE, constants.HF_HUB_CACHE = True, cache
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE, constants.HF_HUB_CACHE = saved
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
