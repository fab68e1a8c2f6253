"""The sizes of a run (batches, sequence, parallelism, world, iterations), checked before anything divides by them.

Bridge's ``runtime_config_update`` divides by the parallel sizes and the micro-batch size before it checks them
(``ConfigContainer.get_data_parallel_size``, ``config.py``; the eval batch check, ``config.py``), so
``train.micro_batch_size=0`` ends in a ``ZeroDivisionError`` from inside Bridge, and a global batch that does not
divide is reported as ``eval_global_batch_size (3) must be divisible ...``, a setting the user never wrote. This
module is the one early look at every user-facing size of a ``ConfigContainer``: each must be an integer at least
its minimum, and the products must divide (world size by tp x pp x cp, global batch by micro batch x dp). It reads
the config and changes nothing, so a refused config is left as it was. :func:`check_positive` is the one copy of
the "a positive integer" rule; :mod:`bridge_cudagraph.plan` uses it for its own arguments.
"""

from __future__ import annotations

from typing import Any

from bridge_cudagraph.config import CudaGraphConfigError

__all__ = ["SIZES", "check_positive", "check_sizes", "check_world_size"]

#: (setting, smallest allowed value, whether null is allowed, what the setting counts) for every size that Bridge,
#: Megatron-Core or the graphs divide by, split by or loop over. The first part of the setting is the
#: ConfigContainer section; a section or field the config does not have is skipped (e.g. ``dataset.seq_length`` on
#: a dataset that names it differently).
SIZES: tuple[tuple[str, int, bool, str], ...] = (
    ("train.micro_batch_size", 1, False, "samples per GPU per micro-batch"),
    ("train.global_batch_size", 1, True, "samples per optimizer step"),
    ("train.train_iters", 0, True, "optimizer steps; 0 skips training"),
    ("train.train_samples", 1, True, "training samples"),
    ("model.seq_length", 1, False, "tokens per sample"),
    ("dataset.seq_length", 1, True, "tokens per sample"),
    ("model.tensor_model_parallel_size", 1, False, "GPUs per tensor-parallel group"),
    ("model.pipeline_model_parallel_size", 1, False, "pipeline stages"),
    ("model.context_parallel_size", 1, False, "GPUs per context-parallel group"),
    ("model.expert_model_parallel_size", 1, False, "GPUs per expert-parallel group"),
    ("model.expert_tensor_parallel_size", 1, True, "GPUs per expert tensor-parallel group"),
    ("model.virtual_pipeline_model_parallel_size", 1, True, "model chunks per pipeline stage"),
    ("model.num_layers", 1, False, "transformer layers"),
    ("model.hidden_size", 1, False, "hidden width"),
    ("model.num_attention_heads", 1, False, "attention heads"),
    ("model.cuda_graph_warmup_steps", 0, True, "eager steps before capture"),
    ("validation.eval_micro_batch_size", 1, True, "samples per GPU per evaluation micro-batch"),
    ("validation.eval_global_batch_size", 1, True, "samples per evaluation step"),
    ("validation.eval_iters", 0, True, "evaluation steps"),
    ("validation.eval_interval", 1, True, "steps between evaluations"),
    ("scheduler.lr_warmup_iters", 0, True, "learning-rate warmup steps"),
)

_MISSING = object()


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_positive(name: str, value: Any, *, minimum: int = 1, fix: str = "") -> None:
    """Refuse ``value`` unless it is an integer ``>= minimum`` (``True`` is not an integer here).

    Args:
        name: The setting as the user writes it (``train.micro_batch_size``).
        value: Its value.
        minimum: The smallest allowed value.
        fix: What the setting counts, for the message (``samples per GPU per micro-batch``).

    Raises:
        CudaGraphConfigError: One line with the setting, the value and the fix.
    """
    if _is_integer(value) and value >= minimum:
        return
    what = f" ({fix})" if fix else ""
    kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    raise CudaGraphConfigError(
        f"{name} must be {kind}{what}, got {type(value).__name__} {value!r}; set it to {minimum} or more"
    )


def _lookup(config: Any, setting: str) -> Any:
    obj = config
    for part in setting.split("."):
        obj = getattr(obj, part, _MISSING) if obj is not None else _MISSING
        if obj is _MISSING:
            return _MISSING
    return obj


def check_world_size(world_size: Any) -> None:
    """Refuse a world size that is not a positive integer (the CLI asks this of ``--world-size`` before it imports
    anything heavy; :func:`check_sizes` of every world size)."""
    if not (_is_integer(world_size) and world_size >= 1):
        raise CudaGraphConfigError(
            f"world size must be a positive integer (GPUs of the job), got {world_size!r}; pass --world-size N "
            "(validate, plan) or launch with torchrun (train)"
        )


def check_sizes(config: Any, world_size: Any) -> None:
    """Check every size in :data:`SIZES` on a Bridge ``ConfigContainer``, then the products that must divide.

    Run it before Bridge's ``runtime_config_update``: that is where a zero would divide.

    Args:
        config: The ``ConfigContainer`` (not yet finalized).
        world_size: The GPUs of the job (``--world-size``, the recipe file's ``world_size``, or ``WORLD_SIZE``).

    Raises:
        CudaGraphConfigError: A size is not an integer at its minimum, or a product does not divide; one line with
            the setting and the fix.
    """
    check_world_size(world_size)
    for setting, minimum, nullable, counts in SIZES:
        value = _lookup(config, setting)
        if value is _MISSING or (value is None and nullable):
            continue
        check_positive(setting, value, minimum=minimum, fix=counts)
    model, train = config.model, config.train
    tp, pp, cp = model.tensor_model_parallel_size, model.pipeline_model_parallel_size, model.context_parallel_size
    model_parallel = tp * pp * cp
    if world_size % model_parallel:
        fits = [model_parallel * k for k in (1, 2, 4)]
        raise CudaGraphConfigError(
            f"world size {world_size} is not divisible by model.tensor_model_parallel_size {tp} x "
            f"model.pipeline_model_parallel_size {pp} x model.context_parallel_size {cp} = {model_parallel} "
            f"({world_size} % {model_parallel} = {world_size % model_parallel}); use a world size that is a multiple "
            f"of {model_parallel} (e.g. {', '.join(map(str, fits))}) or parallel sizes whose product divides "
            f"{world_size}"
        )
    dp = world_size // model_parallel
    gbs, mbs = train.global_batch_size, train.micro_batch_size
    if gbs is not None and getattr(train, "rampup_batch_size", None) is None and gbs % (mbs * dp):
        per_step = mbs * dp
        raise CudaGraphConfigError(
            f"train.global_batch_size {gbs} is not divisible by train.micro_batch_size {mbs} x data-parallel size "
            f"{dp} (world size {world_size} / model parallel {model_parallel}) = {per_step} ({gbs} % {per_step} = "
            f"{gbs % per_step}); set train.global_batch_size to a multiple of {per_step} (e.g. "
            f"{per_step * max(1, -(-gbs // per_step))}), or change train.micro_batch_size or the world size"
        )
