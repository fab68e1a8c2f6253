"""Who still holds GPU memory after a model was deleted: referrer chains of the largest live CUDA tensors.

The benchmark builds, trains and deletes one model per variant in one process; on 2026-11-29 (H200, the small
Qwen3-VL) every variant after the first started with the previous model's 36 GiB (weights, gradient buffers and
Adam states) still allocated, enough to run the largest configuration out of memory. This module answers "what
holds it" from inside the process, so the answer comes back in the benchmark's JSON rather than needing a debugger
on a machine that is gone by then.
"""

from __future__ import annotations

import gc
import sys
import types
from collections.abc import Iterable

import torch


def _nbytes(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().nbytes()
    except Exception:  # a tensor without storage (meta, sparse, a subclass): it holds no device memory we can see
        return 0


def largest_cuda_tensors(count: int = 3) -> list[torch.Tensor]:
    """The ``count`` live CUDA tensors with the largest storages (one per storage), largest first."""
    seen: dict[int, torch.Tensor] = {}
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and obj.is_cuda:
                seen.setdefault(obj.untyped_storage().data_ptr(), obj)
        except Exception:  # objects whose isinstance or attributes raise
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
    return f"{type(obj).__module__}.{name}"


def _rank(obj: object) -> int:
    """Walk order: globals first, then owners (instances, closures), then plain containers."""
    if isinstance(obj, types.ModuleType):
        return 0
    if isinstance(obj, dict | list | tuple | set):
        return 2
    return 1


def holder_chains(target: object, *, depth: int = 10, width: int = 3, ignore: Iterable[object] = ()) -> list[str]:
    """Referrer chains from ``target`` up to ``depth`` levels (at most ``width`` referrers per level), each as
    ``"Tensor <- dict['x'] <- pkg.Owner <- ..."``; a chain ends early at a module (a global) or at an object nothing
    else refers to (a stack frame's local, or a C-level owner gc cannot see)."""
    skip = {id(target), id(sys._getframe()), *map(id, ignore)}
    chains: list[str] = []

    def walk(obj: object, path: list[str], seen: set[int], level: int) -> None:
        if len(chains) >= width * 4:
            return
        referrers = [
            r
            for r in gc.get_referrers(obj)
            if id(r) not in skip and id(r) not in seen and not isinstance(r, types.FrameType)
        ]
        skip.add(id(referrers))  # this walk's own lists refer to what they hold
        referrers.sort(key=_rank)
        if level >= depth or not referrers or isinstance(obj, types.ModuleType):
            chains.append(" <- ".join(path))
            return
        for ref in referrers[:width]:
            walk(ref, [*path, _describe(ref, obj)], seen | {id(ref)}, level + 1)

    walk(target, [f"Tensor{tuple(target.shape)} {target.dtype} {_nbytes(target) / 2**20:.0f} MiB"], set(), 0)
    return chains


def leak_report(count: int = 2, *, depth: int = 10) -> dict:
    """What is still allocated on the current CUDA device and, for the ``count`` largest live tensors, who holds
    them (:func:`holder_chains`). Call after the objects expected to be freed are gone and ``gc.collect()`` ran."""
    gc.collect()
    tensors = largest_cuda_tensors(count)
    report = {
        "allocated_bytes": torch.cuda.memory_allocated() if torch.cuda.is_available() else 0,
        "largest": [],
    }
    for tensor in tensors:
        report["largest"].append(
            {"mib": round(_nbytes(tensor) / 2**20, 1), "holders": holder_chains(tensor, depth=depth, ignore=[tensors])}
        )
    del tensors
    return report
