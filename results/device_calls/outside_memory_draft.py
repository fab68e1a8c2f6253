"""Where the ~14.6 GiB of GPU memory outside PyTorch's allocator comes from (every out-of-memory message of the 2B
padded variants and the 30B-A3B shape on an 80 GB H100, runs 92 and 94): print it after each stage of the
benchmark's set-up, with the default group initialised as the test world did until now (bound to the device: torch
creates every group's NCCL communicator up front), unbound (as Bridge's initialize does: each communicator at its
first collective), or bound with NCCL_COMM_SPLIT_SHARE_RESOURCES=1; in the unbound mode, then through one tiny-MoE
benchmark with packed graphs (a communicator created lazily must not fall inside a capture).

    python3 outside_memory_draft.py MODE OUT_DIR      # MODE: bound | unbound | shared

Each line: stage, GiB outside the allocator, GiB reserved. A draft for one device call (not shipped)."""

import os
import sys

mode, out_dir = sys.argv[1], sys.argv[2]
if mode == "shared":
    os.environ["NCCL_COMM_SPLIT_SHARE_RESOURCES"] = "1"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def outside() -> tuple[float, float]:
    """GiB in use outside PyTorch's allocator (the whole device: run alone), and GiB reserved by it."""
    free, total = torch.cuda.mem_get_info()
    reserved = torch.cuda.memory_reserved()
    return (total - free - reserved) / 2**30, reserved / 2**30


def say(stage: str) -> None:
    """One ``[outside]`` line for ``stage``."""
    out, reserved = outside()
    print(f"[outside] {mode:<8} {stage:<34} {out:7.2f} GiB outside  {reserved:7.2f} GiB reserved", flush=True)


torch.zeros(1, device="cuda")
say("cuda context")
import megatron.bridge  # noqa: E402,F401

from benchmarks import useful_tokens  # noqa: E402

say("imports (TE, Bridge, benchmark)")
for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
    os.environ.setdefault(key, value)
os.environ.setdefault("MASTER_PORT", "29731")
torch.cuda.set_device(0)
dist.init_process_group("nccl", **({} if mode == "unbound" else {"device_id": torch.device("cuda", 0)}))
say("default group")
from bridge_cudagraph.parallel.layout import VisionLayout  # noqa: E402
from bridge_cudagraph.testing.world import close_world, init_world  # noqa: E402

world = init_world(vision=VisionLayout(), seed=1234)
say("init_world (both collections)")
dist.barrier()
say("first barrier")
if mode == "unbound":
    args = useful_tokens.parse_args(
        f"--out {out_dir} --model tiny-moe --variants eager_packed,ours_packed --warmup 1 --steps 2 "
        "--profile-steps 0 --no-paired --no-control".split()
    )
    data = useful_tokens.run_all(args, world=world)
    say("after tiny-moe eager_packed, ours_packed")
    for name, rec in data["variants"].items():
        if rec.get("status") != "not run":
            print(f"[outside] {mode} {name}: {rec.get('status')} {rec.get('error', '')[:200]}", flush=True)
close_world(world)
say("after close_world")
