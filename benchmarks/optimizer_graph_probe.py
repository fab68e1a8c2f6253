"""Why does Bridge's optimizer CUDA graph (``optimizer.optimizer_cuda_graph=true``) change the losses? Issue #18.

Seen on the H200 (tiny recipe, our graphs on, 20 iterations): with the optimizer graph the loss drifts from the
eager optimizer's (6.854022 vs 6.853895 at iteration 19). The flag does two things: megatron-core passes
``capturable=config.optimizer_cuda_graph`` to TE's ``FusedAdam`` (``megatron/core/optimizer/__init__.py``), which
then runs its *capturable* kernel on every step, eager ones included, and Bridge wraps the step in
``OptimizerCudaGraphWrapper``. This probe separates the two on a plain parameter set with megatron-core's own grad
norm and clipping (clip 1.0), a warmup + cosine learning rate written the way the scheduler writes it (``fill_`` on
a device ``lr``), Adam-W with weight decay 0.01, capture at step 3 as the wrapper does, 20 steps:

* ``E0``: eager, the default kernel; ``E1``: eager, ``capturable=True``; ``G1``: ``capturable=True`` captured;
* the same with a constant learning rate (``c``) and without bias correction (``n``).

It prints the largest parameter difference after every step for each pair. Run on 2026-12-01 (H200):
``G1`` vs ``E1`` 0.0 at every step (the graph replays the capturable kernel exactly and the learning rate stays
live), ``E1`` vs ``E0`` 1.2e-7 to 2.4e-7 from the first step with a non-zero learning rate (1-2 fp32 ulps:
the capturable kernel rounds differently), also at a constant learning rate and without bias correction
(``results/padded-levers/optimizer_graph_probe/``).

    python -m benchmarks.optimizer_graph_probe
"""

from __future__ import annotations

import math
import os

N, WARMUP, MAX_LR, MIN_LR, CAPTURE_AT = 20, 5, 3e-4, 3e-5, 3


def lr_at(i: int, constant: bool) -> float:
    """Warmup then cosine, as Bridge's scheduler (or constant)."""
    if constant:
        return MAX_LR
    if i <= WARMUP:
        return MAX_LR * i / WARMUP
    return MIN_LR + (MAX_LR - MIN_LR) * 0.5 * (math.cos(math.pi * (i - WARMUP) / (N - WARMUP)) + 1)


def run(capturable: bool, graph: bool, constant: bool = False, bias_correction: bool = True):
    """Parameters after every step, and what the optimizer's ``lr`` and ``step`` are at the end."""
    import torch
    import torch.distributed as dist
    from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32, get_grad_norm_fp32
    from transformer_engine.pytorch.optimizers import FusedAdam

    g = torch.Generator(device="cuda").manual_seed(0)
    params = [torch.randn(s, device="cuda", generator=g) for s in [(1024, 1024), (4096,), (512, 2048)]]
    for p in params:
        p.grad = torch.zeros_like(p)
    opt = FusedAdam(
        [{"params": params}],
        lr=MAX_LR,
        betas=(0.9, 0.95),
        weight_decay=0.01,
        adam_w_mode=True,
        capturable=capturable,
        bias_correction=bias_correction,
    )
    group = opt.param_groups[0]

    def set_lr(value: float) -> None:
        if torch.is_tensor(group["lr"]):
            group["lr"].fill_(value)  # as OptimizerParamScheduler.step does for a device lr
        else:
            group["lr"] = value

    def step():
        norm = get_grad_norm_fp32([p.grad for p in params], grad_stats_parallel_group=dist.group.WORLD)
        clip_grad_by_total_norm_fp32(params, 1.0, norm)
        opt.step()
        return norm

    cuda_graph, out = None, []
    set_lr(lr_at(0, constant))
    for i in range(N):
        gg = torch.Generator(device="cuda").manual_seed(100 + i)
        for p in params:
            p.grad.copy_(torch.randn(p.shape, device="cuda", generator=gg) * (1e-3 * (i + 1)))
        if graph and i == CAPTURE_AT:
            cuda_graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
            torch.cuda.synchronize()
            with torch.cuda.graph(cuda_graph, stream=stream):
                step()
            torch.cuda.synchronize()
        if cuda_graph is None:
            step()
        else:
            cuda_graph.replay()
        set_lr(lr_at(i + 1, constant))
        out.append(torch.cat([p.detach().flatten().clone() for p in params]))
    lr = group["lr"]
    info = (type(lr).__name__, str(getattr(lr, "device", "host")), float(lr), str(group.get("step")))
    return out, info


def main() -> int:
    """Run the eight variants and print the per-step differences of six pairs."""
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    variants = {
        "E0": (False, False),
        "E1": (True, False),
        "G1": (True, True),
        "E0c": (False, False, True),
        "G1c": (True, True, True),
        "E1c": (True, False, True),
        "E0n": (False, False, False, False),
        "E1n": (True, False, False, False),
    }
    results = {name: run(*args) for name, args in variants.items()}
    for name, (_, info) in results.items():
        print(name, info)
    for a, b in [("E1", "E0"), ("G1", "E1"), ("G1", "E0"), ("E1c", "E0c"), ("G1c", "E1c"), ("E1n", "E0n")]:
        pairs = zip(results[a][0], results[b][0], strict=True)
        diffs = " ".join(f"{(x - y).abs().max().item():.1e}" for x, y in pairs)
        print(a, "vs", b, ":", diffs)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
