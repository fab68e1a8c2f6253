"""A local Qwen3-VL fine-tuning set of conversations with several images each, in Bridge's native chat schema,
built offline.

Real multi-image fine-tuning data (chat logs, interleaved image-text sets such as the_cauldron) has rows of 1 to a
handful of images, turns that bring more images or none, and rows with no image at all. Bridge 0.6.2 reads such rows
without a schema adapter (``HFDatasetSourceConfig(path_or_dataset=<folder>)``, ``schema_adapter`` unset: its
``_native_conversation_adapter`` in ``data/sources/hf_adapters.py``) from a ``messages`` column of OpenAI-style
turns whose ``content`` lists parts ``{"type": "image", "image": ...}`` and ``{"type": "text", "text": ...}``; its
Qwen-VL collate finds the images with ``qwen_vl_utils.process_vision_info``. The one adapter for the_cauldron's
schema, ``raven``, keeps a row's first text turn only and drops rows without an image, so it cannot carry multi-turn
or text-only samples; the native schema carries all three.

How the rows are stored: the ``messages`` column is a ``datasets.Json`` feature, so each part keeps only its own keys
(an Arrow struct would give every text part an ``image: None``, which ``process_vision_info`` takes for an image), and
each image is a JPEG file of the set, named in its part by absolute path (what ``qwen_vl_utils.fetch_image`` opens,
as in a user's local set of image files). So the images are decoded in the collate, in the DataLoader's workers, not
when the split is loaded. Not data URIs: Bridge's assistant-mask builder tokenizes every string of a conversation
(``_conversation_contains_boundary_tokens``), a base64 image too (about 300k tokens for one sample of this set). The
rows are in ``data/`` of the set's folder and the images in ``images/`` (``datasets`` infers a folder's format from
its files).

Each sample is a pure function of ``(seed, split, index)``: every ``text_only_every``-th sample has no image; the
others 1 to ``max_images`` views of :data:`~bridge_cudagraph.examples.photos.PHOTOS` (random crops, long side
``min_side..max_side`` px, log-uniform), the first in the first user turn and the rest spread over the turns; a
``multi_turn`` share of the samples has 2 or 3 user turns. The answers are computed from the views' real pixels
(subject, size, mode, mean colour, brightness, contrast), so the text says something true about each image.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
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
from bridge_cudagraph.examples.photos import PHOTOS, SPLITS, Photo, random_view

__all__ = [
    "ConversationSetSpec",
    "build_conversation_set",
    "conversation_sample",
    "conversation_texts",
    "image_parts",
    "user_turns",
]


@dataclass(frozen=True)
class ConversationSetSpec:
    """What a conversation set is made of; equal specs make the same samples, and under the same root byte-identical
    sets (the cache key hashes the spec and the root: the rows name their images by absolute path).

    Attributes:
        sizes: Samples per split, in :data:`~bridge_cudagraph.examples.photos.SPLITS` order.
        seed: Seed of every choice (turns, photos, crops, sizes, questions).
        min_side, max_side: Range of an image's long side in pixels (log-uniform); Bridge's collate resizes every
            image to 200704..1003520 pixels whatever it is stored at, so 28 px and 900 px both reach the encoder.
        max_images: Most images in one sample (1..max_images, uniform, in the samples with images).
        text_only_every: Every this many samples (indexes ``k * n - 1``) has no image; 0 for none.
        multi_turn: Share of the samples with 2 or 3 user turns (the rest have one).
        jpeg_quality: The images are stored as JPEG at this quality.
    """

    sizes: tuple[int, int, int] = (256, 32, 32)
    seed: int = 48
    min_side: int = 28
    max_side: int = 900
    max_images: int = 6
    text_only_every: int = 8
    multi_turn: float = 0.35
    jpeg_quality: int = 90

    def key(self, root: Path) -> str:
        """A short hash of the spec, of the packages that make the bytes (scikit-image's photos, Pillow's JPEG) and
        of the folder's location ``root`` (the rows name their images by absolute path: a moved cache is rebuilt,
        never read with paths into the old place)."""
        parts = [self.__dict__, *image_package_versions(), _FORMAT, str(root.resolve())]
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


# Bumped when the sample recipe below changes, so a cached set of an older recipe is never reused.
_FORMAT = 1


# ---------------------------------------------------------------------------------------------- what an image shows
@dataclass(frozen=True)
class _View:
    """One image of a conversation and what its pixels say (its number counts from 1 over the conversation)."""

    number: int
    photo: Photo
    image: Any  # PIL image
    mode: str
    mean: str
    brightness: int
    contrast: int

    @classmethod
    def of(cls, number: int, photo: Photo, image: Any) -> _View:
        pixels = np.asarray(image, dtype=np.float64)
        colour = pixels.ndim == 3
        gray = pixels @ np.array([0.299, 0.587, 0.114]) if colour else pixels
        mean = pixels.reshape(-1, 3).mean(0) if colour else np.array([gray.mean()])
        return cls(
            number=number,
            photo=photo,
            image=image,
            mode="colour" if colour else "gray",
            mean=" ".join(str(round(v)) for v in mean),
            brightness=round(float(gray.mean())),
            contrast=round(float(gray.std())),
        )

    @property
    def size(self) -> str:
        return f"{self.image.width}x{self.image.height}"

    def describe(self) -> str:
        level = "dark" if self.brightness < 85 else "mid" if self.brightness < 170 else "bright"
        return (
            f"Image {self.number}: {self.photo.subject}, {self.size} pixels, {self.mode}, mean colour {self.mean}, "
            f"{level} (brightness {self.brightness}), contrast {self.contrast}."
        )


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


# ------------------------------------------------------------------------------------------------ the turns
def _about_new_images(new: list[_View], rng: np.random.Generator) -> tuple[str, str]:
    """A question on the images a user turn brings, and its answer from their pixels."""
    kind = int(rng.integers(3)) if len(new) > 1 else 0
    if kind == 0:
        question = "Describe this photo." if len(new) == 1 else f"Describe these {len(new)} photos."
        return question, " ".join(v.describe() for v in new)
    if kind == 1:
        brightest = max(new, key=lambda v: (v.brightness, -v.number))
        others = ", ".join(f"image {v.number} {v.brightness}" for v in new if v is not brightest)
        return "Which of these photos is the brightest?", (
            f"Image {brightest.number}, {brightest.photo.subject}: brightness {brightest.brightness} (the others: "
            f"{others})."
        )
    colour = [v.number for v in new if v.mode == "colour"]
    listed = ", ".join(map(str, colour)) if colour else "none"
    return "How many of these photos are in colour?", f"{len(colour)} of {len(new)} (images: {listed})."


def _about_earlier_images(seen: list[_View], rng: np.random.Generator) -> tuple[str, str]:
    """A question without new images, on those shown so far."""
    if rng.random() < 0.5:
        largest = max(seen, key=lambda v: (v.image.width * v.image.height, -v.number))
        return "How many images have I shown you so far, and which is the largest?", (
            f"{_plural(len(seen), 'image')}; the largest is image {largest.number} ({largest.size} pixels, "
            f"{largest.photo.subject})."
        )
    view = seen[int(rng.integers(len(seen)))]
    return f"What was image {view.number} again?", view.describe()


def _about_the_collection(rng: np.random.Generator) -> tuple[str, str]:
    """A text-only question on the photographs themselves (their full size and kind)."""
    photo = PHOTOS[int(rng.integers(len(PHOTOS)))]
    full = photo.load()
    mode = "colour" if full.ndim == 3 else "gray"
    if rng.random() < 0.5:
        return f"What does the scikit-image photo '{photo.name}' show?", (
            f"{photo.subject[:1].upper()}{photo.subject[1:]}: a {mode} photograph of {full.shape[1]}x{full.shape[0]} "
            "pixels."
        )
    picks = [PHOTOS[int(i)] for i in rng.choice(len(PHOTOS), size=3, replace=False)]
    colour = [p.name for p in picks if p.load().ndim == 3]
    names = ", ".join(p.name for p in picks)
    return f"Which of these scikit-image photos are in colour: {names}?", (
        ", ".join(colour) + "." if colour else "None of them; all three are gray."
    )


def _text(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}


def conversation_sample(spec: ConversationSetSpec, split: str, index: int) -> tuple[list[dict[str, Any]], list[Any]]:
    """Sample ``index`` of ``split``: ``(messages, images)``, the turns with PIL images in their image parts (as
    ``{"type": "image", "image": <PIL image>}``) and the images in order; a pure function of its arguments."""
    rng = sample_rng(spec.seed, split, index)
    text_only = spec.text_only_every > 0 and index % spec.text_only_every == spec.text_only_every - 1
    turns = int(rng.integers(2, 4)) if rng.random() < spec.multi_turn else 1
    count = 0 if text_only else int(rng.integers(1, spec.max_images + 1))
    # The first image opens the conversation; the others join a turn each at random.
    turn_of = [0, *sorted(int(t) for t in rng.integers(turns, size=max(0, count - 1)))] if count else []
    views: list[_View] = []
    for number in range(1, count + 1):
        photo = PHOTOS[int(rng.integers(len(PHOTOS)))]
        views.append(_View.of(number, photo, random_view(photo.load(), rng, spec.min_side, spec.max_side)))
    messages: list[dict[str, Any]] = []
    for turn in range(turns):
        new = [v for v, t in zip(views, turn_of, strict=True) if t == turn]
        seen = [v for v, t in zip(views, turn_of, strict=True) if t <= turn]
        if new:
            question, answer = _about_new_images(new, rng)
        elif seen:
            question, answer = _about_earlier_images(seen, rng)
        else:
            question, answer = _about_the_collection(rng)
        content = [{"type": "image", "image": v.image} for v in new] + [_text(question)]
        messages.append({"role": "user", "content": content})
        messages.append({"role": "assistant", "content": [_text(answer)]})
    return messages, [v.image for v in views]


# ------------------------------------------------------------------------------------------------ reading rows back
def user_turns(messages: list[dict[str, Any]]) -> int:
    """User turns of a conversation."""
    return sum(1 for turn in messages if turn["role"] == "user")


def image_parts(messages: list[dict[str, Any]]) -> list[Any]:
    """The ``image`` values of a conversation's image parts, in order (a data URI in a stored row)."""
    return [
        part["image"]
        for turn in messages
        if isinstance(turn["content"], list)
        for part in turn["content"]
        if part.get("type") == "image"
    ]


def _text_parts(messages: list[dict[str, Any]]) -> Iterator[str]:
    for turn in messages:
        content = turn["content"]
        if isinstance(content, str):
            yield content
            continue
        yield from (part["text"] for part in content if part.get("type") == "text")


# ------------------------------------------------------------------------------------------------ building
def _stored(messages: list[dict[str, Any]], write_to: Path, named_as: Path, stem: str, quality: int) -> list[dict]:
    """``messages`` with each PIL image written to ``write_to/<stem>-<k>.jpg`` and its part naming the file as
    ``named_as/<stem>-<k>.jpg`` (where it will be once the set is published)."""
    count = 0

    def part(p: dict[str, Any]) -> dict[str, Any]:
        nonlocal count
        if p.get("type") != "image":
            return p
        count += 1
        name = f"{stem}-{count}.jpg"
        (write_to / name).write_bytes(jpeg_bytes(p["image"], quality))
        return {"type": "image", "image": str(named_as / name)}

    return [{"role": turn["role"], "content": [part(p) for p in turn["content"]]} for turn in messages]


def _write_split(staging: Path, target: Path, spec: ConversationSetSpec, split: str, size: int) -> None:
    """One split's rows into ``staging/data``, its images into ``staging/images``, the rows naming the images where
    they will be once ``staging`` is renamed to ``target``."""
    import datasets

    rows: dict[str, list] = {"messages": []}
    for index in range(size):
        messages, _ = conversation_sample(spec, split, index)
        stem = f"{split}-{index}"
        rows["messages"].append(_stored(messages, staging / "images", target / "images", stem, spec.jpeg_quality))
    write_parquet(rows, datasets.Features({"messages": datasets.Json()}), staging / "data" / f"{split}.parquet")


def build_conversation_set(root: str | os.PathLike[str], spec: ConversationSetSpec | None = None) -> Path:
    """The conversation set of ``spec`` under ``root``/``conversations-<key>``: built once, then reused (published
    whole, as :func:`~bridge_cudagraph.examples.photos.build_photo_set`'s).

    Returns:
        The folder of the rows (``.../data``: ``train``, ``validation`` and ``test.parquet``), for
        ``HFDatasetSourceConfig(path_or_dataset=folder)`` (no schema adapter: the rows are Bridge's native chat
        schema); the images are in ``../images``.
    """
    spec = spec or ConversationSetSpec()
    root = Path(root).resolve()  # the rows name their images by absolute path
    target = root / f"conversations-{spec.key(root)}"

    def write(folder: Path) -> None:
        (folder / "data").mkdir()
        (folder / "images").mkdir()
        for split, size in zip(SPLITS, spec.sizes, strict=True):
            _write_split(folder, target, spec, split, size)
        (folder / "spec.json").write_text(json.dumps(spec.__dict__, sort_keys=True) + "\n")  # the marker: last

    return publish_folder(target, "spec.json", write) / "data"


def conversation_texts(folder: str | os.PathLike[str]) -> list[str]:
    """Every text part of a built set (questions and answers of all splits): the corpus the tokenizer is trained on.
    No image is decoded."""
    import pyarrow.parquet as pq

    texts: list[str] = []
    for split in SPLITS:
        for stored in pq.read_table(Path(folder) / f"{split}.parquet", columns=["messages"]).column(0).to_pylist():
            messages = json.loads(stored) if isinstance(stored, str) else stored
            texts.extend(_text_parts(messages))
    return texts
