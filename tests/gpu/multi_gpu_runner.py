"""Two-GPU parity runs (``torchrun --nproc_per_node 2 tests/gpu/multi_gpu_runner.py OUT.json CASE...``).

Each case builds its own pure-M4 collections, a graphed tiny Qwen3-VL and a graphs-off reference with identical
weights in the same layout, trains both 30 steps on identical data, and writes per-step losses, grad norms, an
independently computed grad norm (no double counting of replicated vision weights), vision-replica checks
across language tensor-parallel ranks, step times and graph counts. Rank 0 writes the JSON.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time

import torch
import torch.distributed as dist

from bridge_cudagraph.config import CudaGraphConfig, LanguageGraphConfig, VisionGraphConfig
from bridge_cudagraph.examples import tiny
from bridge_cudagraph.examples.data import qwen3_vl_batch
from bridge_cudagraph.parallel.groups import build_collections, destroy_collections
from bridge_cudagraph.parallel.layout import ParallelLayout, VisionLayout
from bridge_cudagraph.testing.parity import capture_problems, compare_series, megatron_optimizer, train_steps
from bridge_cudagraph.testing.plans import plan_for
from bridge_cudagraph.testing.world import close_world, init_world, parallel_state_untouched, seed_rng

SEQ, MBS, STEPS = 256, 2, 30
CASE_LIMIT_S = float(os.environ.get("BRIDGE_CUDAGRAPH_CASE_LIMIT_S", "150"))
IMAGE_SETS = [
    [[(1, 8, 8)], []],
    [[(1, 8, 8), (1, 12, 8)], [(1, 16, 12)]],
    [[(1, 4, 4), (1, 8, 8)], [(1, 12, 16), (1, 8, 8)]],
]

CASES = {
    "tp2_vtp1": dict(layout=ParallelLayout(tp=2), vtp=1, sp=False, mb=1),
    "tp2_sp_vtp1": dict(layout=ParallelLayout(tp=2), vtp=1, sp=True, mb=1),
    "tp2_vtp2_upstream_layout": dict(layout=ParallelLayout(tp=2), vtp=2, sp=False, mb=1),
    "pp2_4mb": dict(layout=ParallelLayout(pp=2), vtp=1, sp=False, mb=4),
    "dp2_overlap_param_gather": dict(layout=ParallelLayout(), vtp=1, sp=False, mb=1, overlap=True),
}


def _expected_grad_norm(model, language_pgc, vision_pgc) -> float:
    """Grad norm from first principles: language shards summed over the language tp group, vision shards over
    the vision tp group, every replicated weight once (language tp ranks hold identical copies of replicated
    and vision-replicated gradients), then summed over pp. Only valid where the gradient buffers hold the whole
    reduced gradient (data-parallel size 1 with the distributed optimizer)."""
    language_sq = torch.zeros((), device="cuda", dtype=torch.float64)
    replicated_sq = torch.zeros((), device="cuda", dtype=torch.float64)
    vision_sq = torch.zeros((), device="cuda", dtype=torch.float64)
    vision_sharded_sq = torch.zeros((), device="cuda", dtype=torch.float64)
    inner = model[0].module.module
    encoder = getattr(inner, "vision_model", None)
    vision_ids = {id(p) for p in encoder.parameters()} if encoder is not None else set()
    for p in inner.parameters():
        if not p.requires_grad or getattr(p, "main_grad", None) is None:
            continue
        sq = p.main_grad.double().pow(2).sum()
        if id(p) in vision_ids:
            if vision_pgc.tp.size() > 1 and getattr(p, "tensor_model_parallel", False):
                vision_sharded_sq += sq
            else:
                vision_sq += sq
        elif getattr(p, "tensor_model_parallel", False):
            language_sq += sq
        else:
            replicated_sq += sq
    dist.all_reduce(language_sq, group=language_pgc.tp)
    if vision_ids and vision_pgc.tp.size() > 1:
        dist.all_reduce(vision_sharded_sq, group=vision_pgc.tp)
    total = language_sq + replicated_sq + vision_sq + vision_sharded_sq
    dist.all_reduce(total, group=language_pgc.pp)
    return float(total.sqrt())


def _vision_replicas_identical(model, vision_pgc) -> bool:
    """Whether the ranks holding the same vision shard (the replica group) hold identical vision weights."""
    from bridge_cudagraph.vision.replicas import replica_group_of

    inner = model[0].module.module
    group = replica_group_of(vision_pgc)
    if getattr(inner, "vision_model", None) is None or group is None:
        return True
    checksum = torch.stack([p.detach().double().sum() for p in inner.vision_model.parameters()])
    gathered = [torch.empty_like(checksum) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, checksum, group=group)
    return all(torch.equal(gathered[0], g) for g in gathered[1:])


def run_case(name: str, spec: dict) -> dict:
    collections = build_collections(spec["layout"], VisionLayout(tp=spec["vtp"]))
    language, vision = collections["language"], collections.module_pgs.get("vision")
    seed_rng(language, 1234)
    vision_graphs = spec.get("vision_graphs", True)
    cfg = CudaGraphConfig(
        language=LanguageGraphConfig(enabled=True),
        vision=VisionGraphConfig(
            enabled=vision_graphs, tensor_parallel_size=spec["vtp"], token_budgets=[256, 512, 1024]
        ),
        num_microbatches=spec["mb"],
    )
    layout_fields = dict(
        tensor_model_parallel_size=spec["layout"].tp,
        pipeline_model_parallel_size=spec["layout"].pp,
        sequence_parallel=spec["sp"],
    )
    ddp = tiny.ddp_config(overlap_param_gather=True, overlap_grad_reduce=True) if spec.get("overlap") else None
    graphed_provider = tiny.tiny_qwen3_vl_provider(cfg, **layout_fields)
    graphed = tiny.build(graphed_provider, language, vision_pg_collection=vision, ddp=ddp)
    reference_provider = tiny.tiny_qwen3_vl_provider(None, **layout_fields)
    reference_provider.cuda_graph.vision.tensor_parallel_size = spec["vtp"]
    reference = tiny.build(reference_provider, language, vision_pg_collection=vision, ddp=ddp)
    tiny.copy_weights(graphed, reference)

    dp_rank = language.dp.rank()
    steps = [
        [
            qwen3_vl_batch(IMAGE_SETS[(i + m) % len(IMAGE_SETS)], SEQ, seed=1000 * i + 10 * m + dp_rank)
            for m in range(spec["mb"])
        ]
        for i in range(STEPS)
    ]
    row: dict = {
        "case": name,
        "world": dist.get_world_size(),
        "layout": repr(spec["layout"]),
        "vision_tp": spec["vtp"],
        "sequence_parallel": spec["sp"],
        "microbatches": spec["mb"],
    }

    ref_norms: list = []
    times_ref: list = []
    ref_losses = _timed(reference, megatron_optimizer(reference, language), steps, language, ref_norms, times_ref)

    optimizer = megatron_optimizer(graphed, language)
    plan = plan_for(
        graphed_provider,
        world_size=torch.distributed.get_world_size(),
        micro_batch_size=MBS,
        num_microbatches=spec["mb"],
    )
    helpers = graphed_provider.make_graph_helpers(graphed, plan=plan)
    norms: list = []
    expected: list = []
    replicas_ok: list = []
    times: list = []

    def on_step(i):
        if i == graphed_provider.cuda_graph_warmup_steps:
            overlap = bool(spec.get("overlap"))
            if overlap:
                for chunk in graphed:
                    chunk.disable_forward_pre_hook()
            for h in helpers:
                h.create_cudagraphs()
            if overlap:
                for chunk in graphed:
                    chunk.enable_forward_pre_hook()
                for h in helpers:
                    h.cuda_graph_set_manual_hooks()
        if i > 0:
            replicas_ok.append(_vision_replicas_identical(graphed, vision))

    def after_backward():
        expected.append(_expected_grad_norm(graphed, language, vision))

    probe = after_backward if language.dp.size() == 1 else None
    losses = _timed(graphed, optimizer, steps, language, norms, times, on_step=on_step, after_backward=probe)
    replicas_ok.append(_vision_replicas_identical(graphed, vision))
    last = language.pp.rank() == language.pp.size() - 1
    # NaN-safe (parity.compare_series): max() over abs differences skips NaN, and did
    # (results/multi-gpu/two_gpus_run7a.json).
    loss = compare_series(losses, ref_losses, name="loss") if last else None
    norm = compare_series(norms, ref_norms, name="grad norm")
    vs_expected = compare_series(norms, expected, name="grad norm vs first principles") if expected else None
    # Which submodules this rank must have captured: language everywhere, vision where the encoder lives.
    inner = graphed[0].module.module
    holds_vision = vision_graphs and getattr(inner, "vision_model", None) is not None
    expected_helpers = ["language", *(["vision"] if holds_vision else [])]
    stats = {
        h.submodule: {
            "graphs": h.stats.graphs,
            "replays": h.stats.replays,
            "eager_fallbacks": h.stats.eager_fallbacks,
            "failed": h.stats.failed,
        }
        for h in helpers
    }
    problems = [f"{sub}: no helper" for sub in expected_helpers if sub not in stats]
    problems += [p for sub, st in stats.items() for p in capture_problems(st, where=sub)]
    row.update(
        losses=losses if last else None,
        reference_losses=ref_losses if last else None,
        loss_comparison=loss.as_dict() if loss is not None else None,
        max_abs_loss_diff=loss.max_abs if loss is not None else None,
        grad_norms=norms,
        reference_grad_norms=ref_norms,
        grad_norm_comparison=norm.as_dict(),
        max_grad_norm_rel_diff=norm.max_rel,
        expected_grad_norms=expected,
        max_grad_norm_vs_expected_rel=vs_expected.max_rel if vs_expected is not None else None,
        grad_norm_vs_expected_finite=vs_expected.finite if vs_expected is not None else None,
        vision_replicas_identical_every_step=all(replicas_ok),
        graphs={h.submodule: h.stats.graphs for h in helpers},
        counters={
            h.submodule: {"replays": h.stats.replays, "eager_fallbacks": h.stats.eager_fallbacks} for h in helpers
        },
        vision_copies=next((h.copies.count for h in helpers if h.submodule == "vision"), None),
        capture_failed={h.submodule: h.stats.failed for h in helpers},
        expected_helpers=expected_helpers,
        capture_stats=stats,
        capture_problems=problems,
        median_step_ms_reference=_median(times_ref[5:]),
        median_step_ms_graphed=_median(times[5:]),
        parallel_state_untouched=parallel_state_untouched(),
    )
    for h in helpers:
        h.delete_cuda_graphs()
    import gc

    gc.collect()
    torch.cuda.synchronize()
    destroy_collections(collections)
    return row


def _median(values):
    values = sorted(values)
    return values[len(values) // 2] if values else None


def _timed(model, optimizer, steps, pgc, norms, times, on_step=None, after_backward=None):
    from bridge_cudagraph.testing import parity

    state = {"t": 0.0}

    def before(i):
        if on_step is not None:
            on_step(i)
        torch.cuda.synchronize()
        state["t"] = time.perf_counter()

    losses = []
    for i, step in enumerate(steps):
        if after_backward is not None:
            # Expected norm is measured on the gradients the optimizer sees: run the step in two halves.
            before(i)
            losses += parity.train_steps(
                model, _NormProbe(optimizer, after_backward), [step], pg_collection=pgc, grad_norms=norms
            )
        else:
            before(i)
            losses += train_steps(model, optimizer, [step], pg_collection=pgc, grad_norms=norms)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - state["t"]) * 1000)
    return losses


class _NormProbe:
    """Wraps the optimizer: measures the expected grad norm on the finalized gradients, then steps."""

    def __init__(self, optimizer, probe):
        self.optimizer, self.probe = optimizer, probe

    def zero_grad(self):
        self.optimizer.zero_grad()

    def step(self):
        self.probe()
        return self.optimizer.step()


def _meta() -> dict:
    import platform

    from bridge_cudagraph.host.compat import installed_version

    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "world_size": dist.get_world_size(),
        "torch": torch.__version__,
        "megatron_core": installed_version("megatron-core"),
        "megatron_bridge": installed_version("megatron-bridge"),
        "transformer_engine": installed_version("transformer-engine"),
        "python": platform.python_version(),
        "command": "python -m torch.distributed.run --standalone --nproc_per_node 2 tests/gpu/multi_gpu_runner.py "
        + " ".join(sys.argv[1:]),
    }


def main() -> None:
    out, names = sys.argv[1], sys.argv[2:] or list(CASES)
    world = init_world()
    rows = []
    for name in names:
        started = time.perf_counter()
        # A hung case (a collective one rank never joins) dumps every thread's stack and ends the run, so the log
        # shows where; the cases before it are already printed.
        faulthandler.dump_traceback_later(CASE_LIMIT_S, exit=True)
        try:
            rows.append(run_case(name, CASES[name]))
        except Exception as error:  # record and go on: one broken case must not hide the others
            import traceback

            rows.append({"case": name, "error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()})
        faulthandler.cancel_dump_traceback_later()
        rows[-1]["seconds"] = time.perf_counter() - started
        if dist.get_rank() == 0:
            scalars = {k: v for k, v in rows[-1].items() if not isinstance(v, list) and k != "trace"}
            print(json.dumps(scalars, default=str), flush=True)
        # Written after every case, so a later case that hangs does not take the finished ones with it.
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, rows)
        if dist.get_rank() == 0:
            with open(out, "w") as f:
                json.dump({"meta": _meta(), "ranks": gathered}, f, indent=1, default=str)
    dist.barrier()
    started = time.perf_counter()
    close_world(world)
    if os.environ.get("RANK", "0") == "0":
        print(f"multi_gpu_runner: process groups destroyed in {time.perf_counter() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
