"""A random-weight base checkpoint for a PEFT recipe, written once through Bridge's own save path.

Megatron-Bridge 0.6.2 fine-tunes adapters only on top of a base checkpoint, and has no way to start PEFT from a
random initialisation:

* ``ConfigContainer.validate`` asserts ``checkpoint.pretrained_checkpoint`` is set when ``peft`` is
  (``training/config.py``, "PEFT requires a pretrained checkpoint path"), and
  ``CheckpointConfig.finalize`` that it exists (``training/config.py``);
* the PEFT pre-wrap hook raises unless it is a Megatron checkpoint or a Hugging Face folder
  (``training/setup.py``) and loads it into the base model before the adapters are applied
  (``training/setup.py``: ``_load_checkpoint_from_path``, then ``_apply_peft_transformation``);
* ``finetune()`` asserts a checkpoint to load (``training/finetune.py``).

So an offline run with random weights gets a real base checkpoint: :func:`build_random_base` finalizes the recipe's
own provider exactly as Bridge's training does (``runtime_config_update``: bf16, the same module tree, hence the same
checkpoint keys; graphs off, as they change no weight), builds it on the GPU with Megatron's random initialisation
(seeded with the recipe's ``rng.seed``) and saves the weights with Bridge's ``save_megatron_model`` (torch_dist, no
optimizer state: the call ``AutoBridge.import_ckpt`` ends with) at ``checkpoint.pretrained_checkpoint``. The PEFT
run then loads it like any base checkpoint. From the command line, with the overrides of the run it is for::

    python -m bridge_cudagraph.examples.random_base recipes/qwen3_vl_8b_peft_photos_graphs.yaml [key=value ...]

Built once: the folder is written under a temporary name and renamed into place (a killed build leaves nothing Bridge
would take for a checkpoint) with a stamp (:data:`STAMP`: the model's shape, the seed, the format); a folder whose
stamp matches is reused without building anything, and a folder holding anything else is refused, never
overwritten. Qwen3-VL 8B in bf16 is about 17.5 GB on disk, 8.8 billion parameters on the GPU while it is saved.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["STAMP", "RandomBaseError", "base_spec", "build_random_base", "existing_base", "main"]

#: The stamp file inside a checkpoint folder this module wrote.
STAMP = "bridge_cudagraph_random_base.json"

# Bumped when what this module writes changes, so an older base is never taken for a current one.
_FORMAT = 1

# The provider fields that decide the parameters' shapes and their random values.
_MODEL_FIELDS = (
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "kv_channels",
    "vocab_size",
    "make_vocab_size_divisible_by",
    "share_embeddings_and_output_weights",
    "add_bias_linear",
    "add_qkv_bias",
    "qk_layernorm",
    "gated_linear_unit",
    "normalization",
    "position_embedding_type",
    "init_method_std",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "expert_model_parallel_size",
    "num_moe_experts",
)
_VISION_FIELDS = (
    "depth",
    "hidden_size",
    "intermediate_size",
    "num_heads",
    "out_hidden_size",
    "patch_size",
    "temporal_patch_size",
    "spatial_merge_size",
    "in_channels",
    "num_position_embeddings",
    "deepstack_visual_indexes",
)


class RandomBaseError(RuntimeError):
    """The base checkpoint cannot be built here, or its folder holds something else."""


def base_spec(config: Any) -> dict[str, Any]:
    """What the random base of ``config`` (a Bridge ``ConfigContainer``) is: a JSON-able record for the stamp.

    The provider class and model id, the fields that shape the parameters (language and vision), the seed and the
    checkpoint format; two configs with equal specs get interchangeable base checkpoints.
    """
    model = config.model
    spec: dict[str, Any] = {
        "format": _FORMAT,
        "provider": type(model).__name__,
        "hf_model_id": getattr(model, "hf_model_id", None),
        "seed": config.rng.seed,
        "ckpt_format": config.checkpoint.ckpt_format,
        "model": {name: _plain(getattr(model, name, None)) for name in _MODEL_FIELDS},
    }
    vision = getattr(model, "vision_config", None)
    if vision is not None:
        spec["vision"] = {name: _plain(getattr(vision, name, None)) for name in _VISION_FIELDS}
    return spec


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)


def existing_base(path: str | os.PathLike[str], spec: dict[str, Any]) -> bool:
    """Whether ``path`` already holds the base of ``spec`` (True), or nothing (False).

    Raises:
        RandomBaseError: ``path`` exists but is not this module's base of ``spec`` (another checkpoint, another
            model or seed, or a file): it is never overwritten.
    """
    path = Path(path)
    if not path.exists():
        return False
    stamp = path / STAMP
    if not stamp.is_file():
        raise RandomBaseError(
            f"{path} exists and is not a random base checkpoint written by {__name__} (no {STAMP}); it is left "
            "alone: point checkpoint.pretrained_checkpoint at another folder, or remove it"
        )
    found = json.loads(stamp.read_text())
    if found != spec:
        changed = sorted(k for k in set(found) | set(spec) if found.get(k) != spec.get(k))
        raise RandomBaseError(
            f"{path} holds the random base of another model or seed (differs in {', '.join(changed)}); it is left "
            "alone: point checkpoint.pretrained_checkpoint at another folder, or remove it"
        )
    from megatron.bridge.training.utils.checkpoint_utils import checkpoint_exists

    if not checkpoint_exists(str(path)):
        raise RandomBaseError(f"{path} has the stamp {STAMP} but no checkpoint Bridge can load; remove it")
    return True


def build_random_base(config: Any, *, log=print) -> Path:
    """Write the random-weight base checkpoint of ``config`` at its ``checkpoint.pretrained_checkpoint``.

    ``config`` is not changed (a deep copy is finalized). A folder that already holds this base is returned as it
    is. Needs a CUDA GPU; runs on one rank (``WORLD_SIZE`` 1), initialising ``torch.distributed`` and Megatron's
    model-parallel state itself as ``provide_distributed_model`` does, and tearing them down after.

    Returns:
        The checkpoint folder.

    Raises:
        RandomBaseError: No ``checkpoint.pretrained_checkpoint``, no GPU, more than one rank, or a folder of
            something else at that path.
    """
    target = config.checkpoint.pretrained_checkpoint
    if target is None:
        raise RandomBaseError("the recipe sets no checkpoint.pretrained_checkpoint: there is nowhere to write a base")
    target = Path(target)
    spec = base_spec(config)
    if existing_base(target, spec):
        log(f"random_base: {target} already holds this base ({spec['hf_model_id']}, seed {spec['seed']}); reused")
        return target

    import torch

    from bridge_cudagraph.plan.checks import check_stack

    check_stack(config)  # as train checks it: what this machine's stack cannot build, before any weight
    if not torch.cuda.is_available():
        raise RandomBaseError("building a base checkpoint needs a CUDA GPU (the weights are initialised on it)")
    if int(os.environ.get("WORLD_SIZE", "1")) != 1:
        raise RandomBaseError("build the base checkpoint on one rank (WORLD_SIZE=1), then train on any number")

    from megatron.bridge.training.model_load_save import save_megatron_model

    from bridge_cudagraph.plan.from_config import finalize_config

    started = time.perf_counter()
    cfg = copy.deepcopy(config)
    if getattr(cfg.model, "cuda_graph", None) is not None:
        # Graphs change no parameter and no checkpoint key; the base is the model Bridge builds without them.
        cfg.model.cuda_graph.language.enabled = False
        cfg.model.cuda_graph.vision.enabled = False
    finalize_config(cfg, world_size=1, base_checkpoint_needed=False)  # Bridge's own finalization: bf16, ...
    provider = cfg.model

    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.set_device(0)
    owns_world = not torch.distributed.is_initialized()
    if owns_world:
        torch.distributed.init_process_group("nccl", rank=0, world_size=1)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.partial-"))
    try:
        provider.initialize_model_parallel(
            seed=cfg.rng.seed, seed_kwargs={"te_rng_tracker": bool(getattr(provider, "use_te_rng_tracker", False))}
        )
        model = provider.provide_distributed_model(wrap_with_ddp=False)
        params = sum(p.numel() for chunk in model for p in chunk.parameters())
        log(
            f"random_base: {type(provider).__name__} ({spec['hf_model_id']}) built with random weights, "
            f"{params / 1e9:.2f}B parameters, {torch.cuda.memory_allocated() / 2**30:.1f} GiB on the GPU; saving "
            f"with Bridge's save_megatron_model (torch_dist) to {target}"
        )
        save_megatron_model(model, staging, ckpt_format=spec["ckpt_format"])
        del model
        (staging / STAMP).write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n")
        try:
            os.replace(staging, target)
        except OSError:  # another builder renamed its base into place first
            if not existing_base(target, spec):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
        if owns_world:
            torch.distributed.destroy_process_group()
    size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
    log(f"random_base: {target} written, {size / 1e9:.1f} GB in {time.perf_counter() - started:.0f} s")
    return target


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bridge_cudagraph.examples.random_base RECIPE.yaml [key=value ...]``: build (or find) the base."""
    parser = argparse.ArgumentParser(
        prog="python -m bridge_cudagraph.examples.random_base",
        description="Write a random-weight base checkpoint at the recipe's checkpoint.pretrained_checkpoint, once.",
    )
    parser.add_argument("recipe", help="recipe YAML file (the one the PEFT run trains)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="the run's overrides that shape the model")
    args = parser.parse_args(argv)

    from bridge_cudagraph.config import CudaGraphConfigError, UnknownKeyError
    from bridge_cudagraph.parallel.layout import LayoutError
    from bridge_cudagraph.recipe.load import RecipeError, load_recipe

    try:
        build_random_base(load_recipe(args.recipe, args.overrides).config)
    except (RandomBaseError, CudaGraphConfigError, LayoutError, RecipeError, UnknownKeyError) as error:
        # What the CLI reports as a configuration error (the recipe, or this machine's stack), before any weight.
        print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
