"""What the example data sets share: folders published whole into the cache, per-sample random streams, and the
bytes they store (JPEG images, parquet files).

Every rank of a run (and every later run) may build the same example folder at once, so a folder is written under
a temporary name and renamed into place: a reader only ever sees a complete one, and a builder that loses the
rename to an identical folder keeps the winner's. Samples draw from a stream of their own, a pure function of
``(seed, split, index)``, so a set's content does not depend on how many samples are made or in what order.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["image_package_versions", "jpeg_bytes", "publish_folder", "sample_rng", "write_parquet"]


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


def write_parquet(rows: dict[str, list[Any]], features: Any, path: Path) -> None:
    """``rows`` (columns of equal length) as one parquet file of ``datasets`` ``features``, the layout
    ``datasets.load_dataset(folder, split=...)`` reads back with those features.

    Without its progress bars: the sets are built inside verbs whose stderr is the user's (a refusal there must stay
    one ``error:`` line; the first build of a fresh checkout printed nine bar lines before it).
    """
    import datasets

    was_disabled = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        datasets.Dataset.from_dict(rows, features=features).to_parquet(str(path))
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


def jpeg_bytes(image: Any, quality: int) -> bytes:
    """A PIL image as JPEG bytes at ``quality`` (the example sets store their images as JPEG, as CORD-v2 does)."""
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def image_package_versions() -> tuple[str, str]:
    """The versions of the packages that make an example set's bytes (scikit-image's photos, Pillow's JPEG): part
    of every set's cache key, so a set made by other versions is rebuilt, never read."""
    import PIL
    import skimage

    # skimage's __init__.pyi lists __version__ in __all__ but does not declare it (the module sets it)
    return skimage.__version__, PIL.__version__  # type: ignore[attr-defined]
