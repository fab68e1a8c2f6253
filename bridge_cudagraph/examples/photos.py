"""A local Qwen3-VL fine-tuning set of real photographs, in the layout of Bridge's CORD-v2 source, built offline.

Bridge's Qwen3-VL recipes fine-tune on CORD-v2 (receipt photos, each with its parse as JSON), through
``HFDatasetSourceConfig(dataset_name="cord_v2")``: ``datasets.load_dataset`` reads parquet rows with an ``image``
(a ``datasets.Image``) and a ``ground_truth`` string ``{"gt_parse": {...}}``, and Bridge's ``cord_v2`` schema adapter
turns each row into a user turn (the image and a prompt) and an assistant turn (the parse, as ``json2token``
text: ``<s_key>value</s_key>``, lists joined by ``<sep/>``). CORD-v2 needs a download; this module writes rows of
exactly that schema from the photographs scikit-image ships (``skimage.data``, no download), so Bridge's own
source loader, adapter, processor and collate run unchanged on them:
``HFDatasetSourceConfig(path_or_dataset=<folder>, schema_adapter="cord_v2")``.

Each sample is a pure function of ``(seed, split, index)``: one of :data:`PHOTOS`, cropped to an aspect ratio
and resized so its long side is 128..1024 px (log-uniform), and a parse made from the resized image's real
pixels: which photo, its size, its mean colour and contrast, and a grid of 0..10 regions with their mean colour
and brightness (so answers run from about 10 to about 400 tokens, as CORD's receipts from a one-line bill to a
long menu). ``README.md`` beside this file has the distribution.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bridge_cudagraph.examples.cache import (
    image_package_versions,
    jpeg_bytes,
    publish_folder,
    sample_rng,
    write_parquet,
)

__all__ = [
    "ASPECT_RATIOS",
    "PHOTOS",
    "PROMPT",
    "SPLITS",
    "Photo",
    "PhotoSetSpec",
    "answer_texts",
    "build_photo_set",
    "photo_sample",
    "random_view",
]

#: The prompt of every sample (Bridge's ``cord_v2`` adapter takes one prompt per source, ``adapter_kwargs.prompt``).
PROMPT = "Describe this photo as a structured parse."

#: Splits written, as Bridge's builder asks for them (``source.with_split("validation")`` and ``"test"``).
SPLITS = ("train", "validation", "test")

#: Width : height of the crops (CORD's receipts are mostly portrait, camera photos landscape).
ASPECT_RATIOS = ((1, 1), (4, 3), (3, 4), (3, 2), (2, 3), (16, 9), (9, 16), (2, 1), (1, 2))


@dataclass(frozen=True)
class Photo:
    """One photograph of ``skimage.data``: its loader's name and what it shows (the parse's ``subject``)."""

    name: str
    subject: str

    def load(self) -> np.ndarray:
        """The photo as ``uint8`` ``[h, w]`` (gray) or ``[h, w, 3]`` (colour), from scikit-image's own files."""
        return _load_photo(self.name)


#: The photographs used: real camera, telescope and microscope images that scikit-image ships in its wheel (the
#: synthetic ones, and those it would download, are left out). 9 colour, 9 gray.
PHOTOS: tuple[Photo, ...] = (
    Photo("astronaut", "astronaut Eileen Collins"),
    Photo("chelsea", "Chelsea the cat"),
    Photo("coffee", "a cup of coffee"),
    Photo("rocket", "a rocket on its launch pad"),
    Photo("hubble_deep_field", "the Hubble deep field"),
    Photo("immunohistochemistry", "an immunohistochemistry slide"),
    Photo("retina", "a human retina"),
    Photo("motorcycle", "a motorcycle, stereo left view"),
    Photo("colorwheel", "a colour wheel"),
    Photo("camera", "a cameraman"),
    Photo("moon", "the surface of the moon"),
    Photo("coins", "Greek coins"),
    Photo("page", "a scanned page of text"),
    Photo("text", "text on a sign"),
    Photo("clock", "a clock, motion blurred"),
    Photo("brick", "a brick wall"),
    Photo("grass", "grass"),
    Photo("gravel", "gravel"),
)


@functools.cache
def _load_photo(name: str) -> np.ndarray:
    import skimage.data

    if name == "motorcycle":
        image = skimage.data.stereo_motorcycle()[0]
    else:
        image = getattr(skimage.data, name)()
    if image.ndim == 3 and image.shape[2] == 4:
        image = image[..., :3]
    return np.ascontiguousarray(image.astype(np.uint8))


@dataclass(frozen=True)
class PhotoSetSpec:
    """What a photo set is made of; equal specs make byte-identical sets (the cache key is their hash).

    Attributes:
        sizes: Samples per split, in :data:`SPLITS` order.
        seed: Seed of every choice (photo, crop, size, grid).
        min_side, max_side: Range of the long side in pixels (log-uniform).
        max_regions: Largest region grid (rows x cols) in a parse; 0 makes every answer a one-line caption.
        jpeg_quality: The images are stored as JPEG (as CORD's), at this quality.
    """

    sizes: tuple[int, int, int] = (256, 32, 32)
    seed: int = 1234
    min_side: int = 128
    max_side: int = 1024
    max_regions: int = 10
    jpeg_quality: int = 90

    def key(self) -> str:
        """A short hash of the spec and of the packages that make the bytes (scikit-image's photos, Pillow's JPEG)."""
        text = json.dumps([self.__dict__, PROMPT, *image_package_versions(), _FORMAT], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


# Bumped when the sample recipe below changes, so a cached set of an older recipe is never reused.
_FORMAT = 1


def random_view(image: np.ndarray, rng: np.random.Generator, min_side: int, max_side: int):
    """A random crop of ``image`` to one of :data:`ASPECT_RATIOS`, resized (Lanczos) to a long side drawn
    log-uniformly from ``min_side..max_side`` (the short side at least 16 px), as a PIL image. Draws four numbers
    from ``rng``, in a fixed order: a set's bytes depend on it."""
    from PIL import Image

    aw, ah = ASPECT_RATIOS[int(rng.integers(len(ASPECT_RATIOS)))]
    h, w = image.shape[:2]
    crop_w, crop_h = (w, round(w * ah / aw)) if w * ah <= h * aw else (round(h * aw / ah), h)
    top = int(rng.integers(h - crop_h + 1))
    left = int(rng.integers(w - crop_w + 1))
    crop = image[top : top + crop_h, left : left + crop_w]
    long_side = round(float(np.exp(rng.uniform(np.log(min_side), np.log(max_side)))))
    scale = long_side / max(aw, ah)
    size = (max(16, round(aw * scale)), max(16, round(ah * scale)))
    return Image.fromarray(crop).resize(size, Image.Resampling.LANCZOS)


def _level(value: float) -> str:
    return "dark" if value < 85 else "mid" if value < 170 else "bright"


def _parse(photo: Photo, image, rng: np.random.Generator, spec: PhotoSetSpec) -> dict[str, Any]:
    """The structured answer, from the pixels of ``image`` (a PIL image): a CORD-like nested parse."""
    pixels = np.asarray(image, dtype=np.float64)
    gray = pixels if pixels.ndim == 2 else pixels @ np.array([0.299, 0.587, 0.114])
    colour = pixels.ndim == 3
    parse: dict[str, Any] = {"subject": photo.subject}
    # How much detail: a third of the answers are captions, the rest a grid of up to max_regions cells.
    cells = 0 if rng.random() < 1 / 3 or spec.max_regions == 0 else int(rng.integers(1, spec.max_regions + 1))
    if cells == 0:
        return parse
    parse["size"] = {"width": image.width, "height": image.height}
    parse["mode"] = "colour" if colour else "gray"
    mean = pixels.reshape(-1, pixels.shape[-1]).mean(0) if colour else np.array([gray.mean()])
    parse["mean"] = " ".join(str(round(v)) for v in mean)
    parse["contrast"] = str(round(float(gray.std())))
    rows = max(1, round(np.sqrt(cells * image.height / image.width)))
    cols = max(1, cells // rows)
    regions = []
    for r in range(rows):
        for c in range(cols):
            y0, y1 = r * image.height // rows, (r + 1) * image.height // rows
            x0, x1 = c * image.width // cols, (c + 1) * image.width // cols
            block = pixels[y0:y1, x0:x1]
            block_mean = block.reshape(-1, block.shape[-1]).mean(0) if colour else np.array([block.mean()])
            regions.append(
                {
                    "cell": f"r{r}c{c}",
                    "mean": " ".join(str(round(v)) for v in block_mean),
                    "level": _level(float(gray[y0:y1, x0:x1].mean())),
                }
            )
    parse["regions"] = regions
    return parse


def photo_sample(spec: PhotoSetSpec, split: str, index: int) -> tuple[str, Any, dict[str, Any]]:
    """Sample ``index`` of ``split``: ``(photo name, PIL image, parse)``; a pure function of its arguments."""
    rng = sample_rng(spec.seed, split, index)
    photo = PHOTOS[int(rng.integers(len(PHOTOS)))]
    image = random_view(photo.load(), rng, spec.min_side, spec.max_side)
    return photo.name, image, _parse(photo, image, rng, spec)


def _write_split(folder: Path, spec: PhotoSetSpec, split: str, size: int) -> None:
    import datasets

    rows: dict[str, list] = {"image": [], "ground_truth": [], "photo": []}
    for index in range(size):
        name, image, parse = photo_sample(spec, split, index)
        rows["image"].append({"bytes": jpeg_bytes(image, spec.jpeg_quality), "path": None})
        rows["ground_truth"].append(json.dumps({"gt_parse": parse}, sort_keys=True))
        rows["photo"].append(name)
    features = datasets.Features(
        {"image": datasets.Image(), "ground_truth": datasets.Value("string"), "photo": datasets.Value("string")}
    )
    write_parquet(rows, features, folder / f"{split}.parquet")


def build_photo_set(root: str | os.PathLike[str], spec: PhotoSetSpec | None = None) -> Path:
    """The photo set of ``spec`` under ``root``/``photos-<key>``: built once, then reused.

    The folder is written under a temporary name and renamed into place, so a reader (another rank, a later run)
    only ever sees a complete set. It holds ``train.parquet``, ``validation.parquet``, ``test.parquet`` (the
    splits ``datasets.load_dataset(folder, split=...)`` finds by name) and ``spec.json``.

    Returns:
        The folder, for ``HFDatasetSourceConfig(path_or_dataset=folder, schema_adapter="cord_v2")``.
    """
    spec = spec or PhotoSetSpec()
    root = Path(root)
    target = root / f"photos-{spec.key()}"

    def write(folder: Path) -> None:
        for split, size in zip(SPLITS, spec.sizes, strict=True):
            _write_split(folder, spec, split, size)
        (folder / "spec.json").write_text(json.dumps(spec.__dict__, sort_keys=True) + "\n")  # the marker: last

    return publish_folder(target, "spec.json", write)


def answer_texts(folder: str | os.PathLike[str]) -> list[str]:
    """Every text of a built set as the model sees it (the prompt and the ``json2token`` answers of all splits):
    the corpus the tokenizer is trained on. Reads only the ``ground_truth`` column (no image is decoded)."""
    import pyarrow.parquet as pq
    from megatron.bridge.data.token_utils import json2token

    texts = [PROMPT]
    for split in SPLITS:
        for truth in pq.read_table(Path(folder) / f"{split}.parquet", columns=["ground_truth"]).column(0).to_pylist():
            texts.append(json2token(json.loads(truth)["gt_parse"], sort_json_key=True))
    return texts
