"""Run a function in a real multi-process ``torch.distributed`` world (gloo, CPU), for tests.

Each world is one ``torch.multiprocessing.spawn`` of ``world_size`` processes that rendezvous through a file store in
a temporary directory (no TCP port to race for). The function runs on every rank and returns plain picklable data,
which comes back to the test process; an exception on any rank is re-raised by ``spawn`` with that rank's
traceback. Spawning costs a few seconds per process (megatron-core's import), so tests batch many cases per world.

The helpers after :func:`run_world` run inside a world: :func:`tripwire` and :func:`no_parallel_state` prove a code
path never calls a function (``parallel_state``'s above all), :func:`bridge_collection` builds the collection
Megatron-Bridge builds under ``dist.use_decentralized_pg=True``.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
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


# ------------------------------------------------------------------------------- helpers the ranks call inside a world
@contextlib.contextmanager
def tripwire(module: Any, names: list[str]) -> Iterator[None]:
    """Make ``module.<name>`` raise for the duration, to prove a code path never calls it."""
    saved = {n: getattr(module, n) for n in names}

    def trip(name: str):
        def raiser(*args: Any, **kwargs: Any) -> None:
            raise AssertionError(f"{module.__name__}.{name} was called")

        return raiser

    for n in names:
        setattr(module, n, trip(n))
    try:
        yield
    finally:
        for n, fn in saved.items():
            setattr(module, n, fn)


def no_parallel_state():
    """:func:`tripwire` on every getter, setter and initialiser of ``megatron.core.parallel_state``."""
    from megatron.core import parallel_state as ps

    names = [
        n
        for n, v in vars(ps).items()
        if callable(v)
        and getattr(v, "__module__", None) == ps.__name__
        and not isinstance(v, type)
        and n.startswith(("get_", "set_", "initialize_", "destroy_", "model_parallel_is_initialized", "is_"))
    ]
    return tripwire(ps, names)


def bridge_collection(lang: dict[str, Any]) -> Any:
    """The collection Bridge builds with ``dist.use_decentralized_pg=True`` (its ``_create_pg_collection``, unchanged),
    its NCCL backend swapped for gloo. ``lang``: the ``tp``, ``pp``, ``cp``, ``ep`` and ``etp`` sizes (default 1; etp
    None)."""
    import torch.distributed as dist
    from megatron.bridge.training.initialize import _create_pg_collection

    real = dist.new_subgroups_by_enumeration

    def gloo_subgroups(*args: Any, **kwargs: Any) -> Any:
        kwargs["backend"] = "gloo"
        return real(*args, **kwargs)

    config = SimpleNamespace(
        tensor_model_parallel_size=lang.get("tp", 1),
        pipeline_model_parallel_size=lang.get("pp", 1),
        context_parallel_size=lang.get("cp", 1),
        expert_model_parallel_size=lang.get("ep", 1),
        expert_tensor_parallel_size=lang.get("etp"),
        hierarchical_context_parallel_sizes=None,
    )
    dist.new_subgroups_by_enumeration = gloo_subgroups
    try:
        return _create_pg_collection(config, num_distributed_optimizer_instances=1)
    finally:
        dist.new_subgroups_by_enumeration = real
