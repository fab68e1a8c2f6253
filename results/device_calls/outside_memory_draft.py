"""Where the ~14.6 GiB of GPU memory outside PyTorch's allocator comes from (seen in every out-of-memory message of the
2B padded variants and the 30B-A3B shape on an 80 GB H100, runs 92 and 94): print it after each stage of the
benchmark's own set-up and one tiny-MoE eager_packed variant, then after the world's groups are closed.

    python3 outside_memory_draft.py OUT_DIR

Each line: stage, GiB outside the allocator, GiB reserved. A draft for one device call (not shipped)."""

import os
import sys

import torch


def outside() -> tuple[float, float]:
    """GiB in use outside PyTorch's allocator (the whole device: run alone), and GiB reserved by it."""
    free, total = torch.cuda.mem_get_info()
    reserved = torch.cuda.memory_reserved()
    return (total - free - reserved) / 2**30, reserved / 2**30


def say(stage: str) -> None:
    """One ``[outside]`` line for ``stage``, with whether JAX is imported and has a backend (it preallocates)."""
    out, reserved = outside()
    jax = "jax" in sys.modules
    backends = bool(getattr(sys.modules.get("jax._src.xla_bridge"), "_backends", None))
    print(f"[outside] {stage:<34} {out:7.2f} GiB outside  {reserved:7.2f} GiB reserved  jax={jax} backend={backends}")


torch.zeros(1, device="cuda")
say("cuda context")
import transformer_engine.pytorch  # noqa: E402,F401

say("transformer_engine.pytorch")
import megatron.bridge  # noqa: E402,F401

from benchmarks import useful_tokens  # noqa: E402

say("megatron.bridge + benchmark")
from bridge_cudagraph.parallel.layout import VisionLayout  # noqa: E402
from bridge_cudagraph.testing.world import close_world, init_world  # noqa: E402

world = init_world(vision=VisionLayout(), seed=1234)
say("init_world (NCCL, collections)")
torch.distributed.barrier()
say("first barrier")
args = useful_tokens.parse_args(
    [
        "--out",
        sys.argv[1],
        "--model",
        "tiny-moe",
        "--variants",
        "eager_packed",
        "--warmup",
        "1",
        "--steps",
        "2",
        "--profile-steps",
        "0",
        "--no-paired",
        "--no-control",
    ]
)
useful_tokens.run_all(args, world=world)
say("after tiny-moe eager_packed")
close_world(world)
say("after close_world")
print("[outside] env", {k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "NCCL_", "PYTORCH_", "XLA_"))})
