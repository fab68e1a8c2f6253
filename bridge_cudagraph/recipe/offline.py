"""Bridge's config reads answered offline: a recipe's ``hf_config`` folder stands in for the Hugging Face Hub.

Bridge's recipe functions call ``AutoBridge.from_hf_pretrained("Org/Name")``, which needs the Hub. With ``hf_config``
the call is answered from the committed ``config.json`` instead (:func:`offline_hf_config`), with the same model id and
revision, so the provider is the one an online run builds and Bridge's checkpoints still name the real model.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bridge_cudagraph.recipe import RecipeError

__all__ = ["hf_repo_id", "offline_hf_config", "recipe_environment"]


def hf_repo_id(config_dir: str | os.PathLike[str]) -> str:
    """The Hugging Face model id a committed config folder stands for: ``Org--Name`` -> ``Org/Name``.

    The folder is named as in the Hub cache (``models--Org--Name``) without the prefix, so the id survives
    in the path without a side file.
    """
    name = Path(config_dir).name
    org, sep, model = name.partition("--")
    if not sep or not org or not model:
        raise RecipeError(
            f"hf_config folder {name!r} must be named <Org>--<Name> after the Hugging Face model id "
            "(e.g. Qwen--Qwen3-VL-8B-Instruct for Qwen/Qwen3-VL-8B-Instruct)"
        )
    return f"{org}/{model}"


@contextlib.contextmanager
def offline_hf_config(config_dir: str | os.PathLike[str]) -> Iterator[str]:
    """Answer ``AutoBridge.from_hf_pretrained(<id>, revision=...)`` from a committed ``config.json``, offline.

    For the duration of the block: a private Hub cache (``models--Org--Name/snapshots/<rev>/config.json``
    plus ``refs/main``) is laid out in a temporary folder, and ``huggingface_hub`` is switched to it in offline
    mode, so Bridge's own loading code runs unchanged and records the real model id and revision. Setting
    ``HF_HUB_OFFLINE``/``HF_HUB_CACHE`` in the environment is not enough: ``huggingface_hub`` reads them
    once at import (``huggingface_hub/constants.py``), and ``megatron.bridge`` imports it long before a recipe
    runs; the call then retries the unreachable Hub for ~100 s and fails. So the module's constants are set
    too (:func:`~bridge_cudagraph.host.offline_hub.offline_hub`), and everything is restored on exit.
    ``AutoBridge.from_hf_pretrained`` is wrapped
    (:func:`~bridge_cudagraph.host.from_hf_pretrained.from_hf_pretrained_hook`) only to lay the snapshot out under the
    revision the recipe asks for (Bridge pins some, e.g. Qwen3-8B's, to a commit).

    Args:
        config_dir: Folder ``<Org>--<Name>`` holding the model's public ``config.json``.

    Yields:
        The model id served.

    Raises:
        RecipeError: The folder has no ``config.json`` or is misnamed, or the recipe never asked for that model.
    """
    from bridge_cudagraph.host.from_hf_pretrained import from_hf_pretrained_hook
    from bridge_cudagraph.host.offline_hub import offline_hub

    config_dir = Path(config_dir)
    repo_id = hf_repo_id(config_dir)
    if not (config_dir / "config.json").is_file():
        raise RecipeError(f"hf_config {config_dir} has no config.json")
    requested: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bridge_cudagraph_hub_") as cache:
        repo_dir = Path(cache) / f"models--{repo_id.replace('/', '--')}"

        def serve(path: str, kwargs: dict[str, Any]) -> None:
            if path != repo_id:  # offline, any other model would only fail after Bridge's retries
                raise RecipeError(
                    f"the recipe loads the Hugging Face model {path}, but hf_config {config_dir.name} serves "
                    f"{repo_id}; point hf_config at a folder named {path.replace('/', '--')}"
                )
            requested.append(path)
            _lay_out_snapshot(repo_dir, config_dir, kwargs.get("revision"))

        with offline_hub(cache), from_hf_pretrained_hook(serve):
            yield repo_id
    if not requested:
        raise RecipeError(
            f"hf_config {config_dir.name} serves {repo_id}, but the recipe loads no Hugging Face model; drop hf_config"
        )


def _lay_out_snapshot(repo_dir: Path, config_dir: Path, revision: str | None) -> None:
    """One Hub-cache snapshot of ``config_dir`` under ``revision`` (a commit hash, a branch, or main)."""
    import re

    revision = revision or "main"
    commit = revision if re.fullmatch(r"[0-9a-f]{40}", revision) else "0" * 40
    snapshot = repo_dir / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(config_dir / "config.json", snapshot / "config.json")
    if commit != revision:
        (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
        (repo_dir / "refs" / revision).write_text(commit)


@contextlib.contextmanager
def recipe_environment(hf_config: Path | None) -> Iterator[None]:
    """What a recipe function needs on this machine: the offline model config, and no GPU probe."""
    from bridge_cudagraph.host.cpu_device_properties import cpu_device_properties

    with contextlib.ExitStack() as stack:
        if hf_config is not None:
            if not hf_config.is_dir():
                raise RecipeError(f"hf_config {hf_config} does not exist (it is relative to the recipe file)")
            stack.enter_context(offline_hf_config(hf_config))
        stack.enter_context(cpu_device_properties())  # Bridge's MoE recipes read the GPU's properties
        yield
