"""The device memory a capture takes and may still take, as every capture, the benchmarks and the tests count it: the
caching allocator's reserved bytes once the device is idle."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator

import torch

from bridge_cudagraph.capture.stats import CaptureStats

__all__ = ["free_for_capture", "held_reserved", "measure"]


def held_reserved() -> int:
    """The caching allocator's reserved bytes once the device is idle and its unused cached blocks are given back:
    what live tensors and graph pools hold (the one way captures, the benchmarks and the tests count pool memory)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved()


@contextlib.contextmanager
def measure(stats: CaptureStats, *, add: bool = False) -> Iterator[None]:
    """Record capture wall time and the growth of reserved CUDA memory into ``stats`` (``add``: on top of what an
    earlier capture of the same helper recorded)."""
    gc.collect()
    reserved = held_reserved()  # the baseline holds live tensors only, not blocks the capture will free anyway
    start = time.perf_counter()
    try:
        yield
    finally:
        grown = max(0, held_reserved() - reserved)  # the warmups' cached blocks are no graph memory
        seconds = time.perf_counter() - start  # up to the capture's last kernel, which held_reserved waited for
        stats.seconds = stats.seconds + seconds if add else seconds
        stats.graph_memory_bytes = stats.graph_memory_bytes + grown if add else grown


def free_for_capture() -> int:
    """Bytes a capture may still take on this device: what the driver has free plus what the caching allocator
    holds unused, under the process's cap when one is set (``torch.cuda.set_per_process_memory_fraction``, the
    80 GiB emulation of ``--gpu-memory``)."""
    free, total = torch.cuda.mem_get_info()
    reserved, allocated = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    available = free + reserved - allocated
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if fraction is not None:
        with contextlib.suppress(Exception):
            available = min(available, int(fraction() * total) - allocated)
    return max(0, available)
