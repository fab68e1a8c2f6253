"""Who still holds a deleted model: referrer chains of an object (or of the largest live CUDA tensors), and
:func:`release_training_memory`, which frees its large storages whatever holds the Python objects."""

from __future__ import annotations

import gc
import sys
import types
from collections.abc import Iterable
from typing import Any

import torch


def _nbytes(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().nbytes()
    except Exception:  # a tensor without storage (meta, sparse, a subclass)
        return 0


def largest_cuda_tensors(count: int = 3) -> list[torch.Tensor]:
    """The ``count`` live CUDA tensors with the largest storages (one per storage), largest first."""
    seen: dict[int, torch.Tensor] = {}
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and obj.is_cuda:
                seen.setdefault(obj.untyped_storage().data_ptr(), obj)
        except Exception:  # an object whose isinstance or attributes raise
            continue
    return sorted(seen.values(), key=_nbytes, reverse=True)[:count]


def _describe(obj: object, child: object | None) -> str:
    """A short label: the object's type, and the key or attribute under which it holds ``child``."""
    name = type(obj).__qualname__
    if isinstance(obj, dict) and child is not None:
        keys = [k for k, v in obj.items() if v is child][:1]
        return f"dict[{keys[0]!r}]" if keys else "dict"
    if isinstance(obj, list | tuple) and child is not None:
        return f"{name}[{next((i for i, v in enumerate(obj) if v is child), '?')}]"
    if isinstance(obj, types.FunctionType):
        return f"function {obj.__module__}.{obj.__qualname__}"
    if isinstance(obj, types.MethodType):
        return f"bound method {type(obj.__self__).__qualname__}.{obj.__func__.__name__}"
    if isinstance(obj, types.ModuleType):
        return f"module {obj.__name__}"
    if isinstance(obj, types.CellType):
        return "closure cell"
    if isinstance(obj, types.FrameType):
        return f"frame of {obj.f_code.co_qualname} ({obj.f_code.co_filename}:{obj.f_lineno})"
    if isinstance(obj, types.TracebackType):
        return "traceback"
    return f"{type(obj).__module__}.{name}"


def _is_own_frame(obj: object) -> bool:
    """A frame of this module (the walk's own locals refer to everything it visits)."""
    return isinstance(obj, types.FrameType) and obj.f_code.co_filename == __file__


def _rank(obj: object) -> int:
    """Walk order: globals first, then owners (instances, closures), then plain containers."""
    return 0 if isinstance(obj, types.ModuleType) else 2 if isinstance(obj, dict | list | tuple | set) else 1


def holder_chains(target: object, *, depth: int = 10, width: int = 3, ignore: Iterable[object] = ()) -> list[str]:
    """Referrer chains from ``target`` up to ``depth`` levels (at most ``width`` referrers per level), each as
    ``"Tensor <- dict['x'] <- pkg.Owner <- ..."``, ending early at a module or at an object nothing else refers to."""
    skip = {id(target), id(sys._getframe()), *map(id, ignore)}
    chains: list[str] = []

    def walk(obj: object, path: list[str], seen: set[int], level: int) -> None:
        if len(chains) >= width * 4:
            return
        referrers = [
            r for r in gc.get_referrers(obj) if id(r) not in skip and id(r) not in seen and not _is_own_frame(r)
        ]
        skip.add(id(referrers))  # this walk's own lists refer to what they hold
        referrers.sort(key=_rank)
        if level >= depth or not referrers or isinstance(obj, types.ModuleType):
            chains.append(" <- ".join(path))
            return
        for i in range(min(width, len(referrers))):  # by index: a slice or an iterator would be a referrer too
            walk(referrers[i], [*path, _describe(referrers[i], obj)], seen | {id(referrers[i])}, level + 1)

    if isinstance(target, torch.Tensor):
        label = f"Tensor{tuple(target.shape)} {target.dtype} {_nbytes(target) / 2**20:.0f} MiB"
    else:
        label = _describe(target, None)
    walk(target, [label], set(), 0)
    return chains


def leak_report(count: int = 2, *, depth: int = 10) -> dict:
    """What is still allocated on the current CUDA device and who holds the ``count`` largest live tensors."""
    gc.collect()
    tensors = largest_cuda_tensors(count)
    report: dict[str, Any] = {"allocated_bytes": torch.cuda.memory_allocated() if torch.cuda.is_available() else 0}
    report["largest"] = [
        {"mib": round(_nbytes(t) / 2**20, 1), "holders": holder_chains(t, depth=depth, ignore=[tensors])}
        for t in tensors
    ]
    del tensors
    return report


def training_tensors(model, optimizer) -> list[torch.Tensor]:
    """A Megatron DDP model's parameter and gradient buffers, and its inner optimizers' parameters and states."""
    tensors: list[torch.Tensor] = []
    for chunk in model or []:
        # DDP's buffers are lists; on a plain module ``buffers`` is a method.
        lists = [getattr(chunk, name, None) for name in ("buffers", "expert_parallel_buffers")]
        for buffer in [b for bufs in lists if isinstance(bufs, list) for b in bufs]:
            pair = (getattr(buffer, "param_data", None), getattr(buffer, "grad_data", None))
            tensors += [t for t in pair if t is not None]
    optimizers = getattr(optimizer, "chained_optimizers", None) or ([optimizer] if optimizer is not None else [])
    for opt in optimizers:
        if (inner := getattr(opt, "optimizer", None)) is None:
            continue
        tensors += [p for group in inner.param_groups for p in group["params"]]
        tensors += [v for state in inner.state.values() for v in state.values() if torch.is_tensor(v)]
    return tensors


def release_training_memory(model, optimizer) -> int:
    """Shrink the CUDA storages of :func:`training_tensors` to nothing; returns the bytes released."""
    released = 0
    storages: dict[int, torch.UntypedStorage] = {}
    for tensor in training_tensors(model, optimizer):
        if tensor.is_cuda:
            storage = tensor.untyped_storage()
            storages.setdefault(storage.data_ptr(), storage)
    for storage in storages.values():
        released += storage.nbytes()
        storage.resize_(0)
    return released
