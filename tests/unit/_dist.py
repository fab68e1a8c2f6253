"""Run a function in a real multi-process ``torch.distributed`` world (gloo, CPU), for tests.

Each world is one ``torch.multiprocessing.spawn`` of ``world_size`` processes that rendezvous through a file store in
a temporary directory (no TCP port to race for). The function runs on every rank and returns plain picklable data,
which comes back to the test process; an exception on any rank is re-raised by ``spawn`` with that rank's
traceback. Spawning costs a few seconds per process (megatron-core's import), so tests batch many cases per world.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

# Gloo collectives time out instead of hanging forever when one rank fails mid-collective.
COLLECTIVE_TIMEOUT = timedelta(seconds=60)


def _entry(rank: int, world_size: int, tmp: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    # Gloo resolves the host name to pick an interface; sandboxes often cannot, loopback always works.
    if Path("/sys/class/net/lo").exists():
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # HyperCommGrid prefers $WORLD_SIZE over torch.distributed; make sure a stray value cannot disagree.
    os.environ.pop("WORLD_SIZE", None)
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"file://{tmp}/store",
        rank=rank,
        world_size=world_size,
        timeout=COLLECTIVE_TIMEOUT,
    )
    try:
        result = fn(rank, world_size, *args)
        with open(os.path.join(tmp, f"result_{rank}.pkl"), "wb") as f:
            pickle.dump(result, f)
    finally:
        dist.destroy_process_group()


def run_world(world_size: int, fn: Callable[..., Any], *args: Any) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; return the per-rank results.

    ``fn`` must be a module-level function of an importable module (spawned children import it by name).
    """
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="bcg_dist_") as tmp:
        mp.spawn(_entry, args=(world_size, tmp, fn, args), nprocs=world_size, join=True)
        results = []
        for rank in range(world_size):
            with open(os.path.join(tmp, f"result_{rank}.pkl"), "rb") as f:
                results.append(pickle.load(f))
    return results
