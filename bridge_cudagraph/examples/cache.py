"""What the example data sets share: folders published whole into the cache, and per-sample random streams.

Every rank of a run (and every later run) may build the same example folder at once, so a folder is written under
a temporary name and renamed into place: a reader only ever sees a complete one, and a builder that loses the
rename to an identical folder keeps the winner's. Samples draw from a stream of their own, a pure function of
``(seed, split, index)``, so a set's content does not depend on how many samples are made or in what order.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

__all__ = ["publish_folder", "sample_rng"]


def publish_folder(target: Path, marker: str, write: Callable[[Path], None]) -> Path:
    """Build a folder under a temporary name with ``write(folder)`` and rename it to ``target``, unless ``target``
    already holds ``marker`` (the last file ``write`` writes); a concurrent builder of the same content may win the
    rename. Returns ``target``."""
    if (target / marker).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        write(staging)
        try:
            os.replace(staging, target)
        except OSError:  # another builder renamed its identical folder into place first
            if not (target / marker).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def sample_rng(seed: int, split: str, index: int) -> np.random.Generator:
    """The random stream of sample ``index`` of ``split`` under ``seed``."""
    key = f"{seed}/{split}/{index}".encode()
    return np.random.default_rng(int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little"))
