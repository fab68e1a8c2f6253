"""Start a pure-M4 world for GPU tests and the benchmark: NCCL, our collections, seeded RNG, nothing global.

``parallel_state`` stays uninitialised on purpose (the tests assert it); the only process-wide state set is
what Megatron-Core keeps outside ``parallel_state``'s groups and has no M4 replacement for: the CUDA RNG
tracker (TE's graph-safe one) and the global memory buffer.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from bridge_cudagraph.parallel.groups import build_collections
from bridge_cudagraph.parallel.layout import ParallelLayout, VisionLayout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class World:
    """This process's place in the world and its two collections."""

    rank: int
    world_size: int
    language: object
    vision: object | None
    collections: object


def init_world(
    language: ParallelLayout | None = None, vision: VisionLayout | None = None, *, seed: int = 1234
) -> World:
    """Initialise NCCL (from torchrun's environment, or a one-GPU world), build the collections, seed RNG.

    The default group is not bound to a device, as Bridge's ``initialize`` leaves it: NCCL then creates a group's
    communicator at its first collective. Bound, torch creates every group's communicator up front, and each holds
    about half a GiB outside PyTorch's allocator even with one rank (NCCL issue 2363), for every group of the
    language and vision collections, most of which a one-GPU run never uses."""
    if not dist.is_initialized():
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
    collections = build_collections(language or ParallelLayout(), vision)
    lang = collections["language"]
    vis = collections.module_pgs.get("vision")
    seed_rng(lang, seed)
    from bridge_cudagraph.host.compat import ensure_global_memory_buffer

    ensure_global_memory_buffer()
    return World(dist.get_rank(), dist.get_world_size(), lang, vis, collections)


def close_world(world: World | None = None, *, hang_after_s: float = 60.0) -> None:
    """Tear the NCCL world down: our collections' groups first, then the default group.

    Call it after every CUDA graph that captured collectives on these groups is deleted. NCCL communicators that
    are never destroyed make the interpreter's exit wait on them (seen on the H200: processes that passed their
    tests did not exit). A watchdog dumps every thread's stack to stderr and exits with code 3 if the teardown
    itself takes longer than ``hang_after_s``, so a hang shows where it is instead of eating a machine's time
    limit silently.
    """
    import faulthandler
    import sys

    faulthandler.dump_traceback_later(hang_after_s, exit=True, file=sys.stderr)
    try:
        if world is not None:
            from bridge_cudagraph.parallel.groups import destroy_collections

            destroy_collections(world.collections)
        if dist.is_initialized():
            torch.cuda.synchronize()
            dist.destroy_process_group()
    finally:
        faulthandler.cancel_dump_traceback_later()


def seed_rng(pgc, seed: int) -> None:
    """Seed torch and TE's graph-safe CUDA RNG tracker with this rank's explicit tp/ep ranks (no globals)."""
    from megatron.core import tensor_parallel

    torch.manual_seed(seed)
    torch.cuda.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(
        seed,
        te_rng_tracker=True,
        tp_rank=pgc.tp.rank(),
        ep_rank=pgc.ep.rank() if pgc.ep is not None else 0,
        etp_rank=pgc.expt_tp.rank() if pgc.expt_tp is not None else 0,
        force_reset_rng=True,
    )


def parallel_state_untouched() -> bool:
    """True when no ``parallel_state`` process group was ever initialised in this process."""
    from megatron.core import parallel_state

    return not parallel_state.model_parallel_is_initialized() and all(
        getattr(parallel_state, name, None) is None
        for name in (
            "_TENSOR_MODEL_PARALLEL_GROUP",
            "_PIPELINE_MODEL_PARALLEL_GROUP",
            "_DATA_PARALLEL_GROUP",
            "_CONTEXT_PARALLEL_GROUP",
        )
    )
