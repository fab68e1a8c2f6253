"""The optimizer host cache (:mod:`bridge_cudagraph.host.optimizer`) steps bit for bit as megatron-core's own step.

30 steps of a tiny GPT and a tiny Qwen3-VL, our graphs captured at the warm-up step, with Bridge's default optimizer
(distributed Adam in bf16 with fp32 main params) here with weight decay, a learning rate that changes every step,
and a clip that engages on every other step. Every optimizer step is taken twice from one saved state, after one
backward: by the host's classes (the mixins taken off, as ``cached_walks.optimizer=false`` leaves them), and with the
mixins. Everything the step writes is compared bit for bit: the bf16 parameters and fp32 main gradients in the DDP
buffers (the clip scales those in place), the fp32 main parameters, both Adam moments, the step counters and the grad
norm; every value must be finite. The cached path must have run: all steps' gradient views and parameter copies, and
every Adam step after the first (the host's first step creates the Adam state). Exact in any determinism mode: both
paths start from one state and launch the same kernels.
"""

from __future__ import annotations

import _optimizer_runs as opt_runs
import pytest
import torch

from bridge_cudagraph.testing.plans import plan_for

pytestmark = pytest.mark.gpu

LRS = (3e-4, 1e-4, 5e-5)  # a different learning rate on consecutive steps: a cached value would show
CLIPS = (1e-3, 1e6)  # clip_grad: clips every gradient / never clips


def _state(targets) -> tuple[dict[str, torch.Tensor], list]:
    """Copies of every tensor an optimizer step writes, and the Adam step counters."""
    from bridge_cudagraph.host.optimizer import CachedAdamLists, CachedShardViews

    tensors: dict[str, torch.Tensor] = {}
    counters = []
    for n, (obj, mixin) in enumerate(targets):
        if mixin is CachedShardViews:
            for b, buffer in enumerate(obj.buffers):
                tensors[f"{n}.buffer{b}.param"] = buffer.param_data.clone()
                tensors[f"{n}.buffer{b}.main_grad"] = buffer.grad_data.clone()
        elif mixin is CachedAdamLists:
            for g, group in enumerate(obj.param_groups):
                counters.append(group.get("step"))
                for p, param in enumerate(group["params"]):
                    tensors[f"{n}.group{g}.param{p}"] = param.detach().clone()
                    for name, value in (obj.state.get(param) or {}).items():
                        tensors[f"{n}.group{g}.param{p}.{name}"] = value.clone()
    return tensors, counters


def _restore(targets, saved) -> None:
    from bridge_cudagraph.host.optimizer import CachedAdamLists, CachedShardViews

    tensors, counters = saved
    steps = iter(counters)
    for n, (obj, mixin) in enumerate(targets):
        if mixin is CachedShardViews:
            for b, buffer in enumerate(obj.buffers):
                buffer.param_data.copy_(tensors[f"{n}.buffer{b}.param"])
                buffer.grad_data.copy_(tensors[f"{n}.buffer{b}.main_grad"])
        elif mixin is CachedAdamLists:
            for g, group in enumerate(obj.param_groups):
                step = next(steps)
                if step is None:
                    group.pop("step", None)
                else:
                    group["step"] = step
                for p, param in enumerate(group["params"]):
                    param.detach().copy_(tensors[f"{n}.group{g}.param{p}"])
                    state = obj.state.get(param) or {}
                    for name in list(state):
                        key = f"{n}.group{g}.param{p}.{name}"
                        if key in tensors:
                            state[name].copy_(tensors[key])
                        else:  # created by the host's first step: the cached run creates it again
                            del state[name]


def _differences(a, b) -> list[str]:
    """Names of the tensors (and counters) that are not bitwise equal, or not finite, between two states."""
    (ta, ca), (tb, cb) = a, b
    out = [f"{name}: not finite" for name, t in ta.items() if t.is_floating_point() and not t.isfinite().all()]
    if ta.keys() != tb.keys():
        out.append(f"different tensors: {sorted(set(ta) ^ set(tb))[:5]}")
    for name in ta.keys() & tb.keys():
        x, y = ta[name], tb[name]
        if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x.view(torch.uint8), y.view(torch.uint8)):
            out.append(name)
    if ca != cb:
        out.append(f"step counters {ca} vs {cb}")
    return out


@pytest.mark.parametrize("kind", ["gpt", "qwen3_vl"])
def test_cached_step_is_the_host_step_bit_for_bit(world, record, kind):
    from bridge_cudagraph.examples import tiny
    from bridge_cudagraph.host import optimizer as optimizer_host
    from bridge_cudagraph.host.instance_class import extend_instance_class, restore_instance_class
    from bridge_cudagraph.testing.parity import assert_captured, megatron_optimizer, train_steps

    provider = opt_runs.provider(kind)
    model = tiny.build(provider, world.language, vision_pg_collection=world.vision)
    optimizer = megatron_optimizer(model, world.language, weight_decay=0.1)
    plan = plan_for(provider, world_size=1, micro_batch_size=opt_runs.MBS, num_microbatches=1)
    assert plan.cached_walks.optimizer, "the plan's default must turn the cache on where graphs are"
    helpers = provider.make_graph_helpers(model, plan=plan)
    targets = optimizer_host.install(optimizer)
    kinds = sorted(mixin.__name__ for _, mixin in targets)
    # get_megatron_optimizer returns a ChainedOptimizer, also around one distributed optimizer
    assert kinds == ["CachedAdamLists", "CachedChainedStep", "CachedShardViews"], kinds
    adam = next(obj for obj, mixin in targets if mixin is optimizer_host.CachedAdamLists)
    warmup = provider.cuda_graph_warmup_steps
    log: list[dict] = []

    def twin_step():
        i = len(log)
        for group in adam.param_groups:
            group["lr"] = LRS[i % len(LRS)]
        optimizer.config.clip_grad = CLIPS[i % len(CLIPS)]
        saved = _state(targets)
        for obj, mixin in targets:  # the host's classes; the cache stays, as it would across steps
            restore_instance_class(obj, mixin)
        host_out = type(optimizer).step(optimizer)
        host_state = _state(targets)
        _restore(targets, saved)
        assert not _differences(saved, _state(targets)), "the saved state did not come back"
        for obj, mixin in targets:
            extend_instance_class(obj, mixin)
        cached_out = type(optimizer).step(optimizer)
        cached_state = _state(targets)
        host_norm, cached_norm = float(host_out[1]), float(cached_out[1])
        log.append(
            {
                "step": i,
                "differences": _differences(host_state, cached_state),
                "success": (host_out[0], cached_out[0]),
                "grad_norm": (host_norm, cached_norm),
                "clipped": host_norm > optimizer.config.clip_grad,
            }
        )
        return cached_out

    def capture(i):
        if i == warmup:
            for helper in helpers:
                helper.create_cudagraphs()

    optimizer.step = twin_step
    try:
        losses = train_steps(model, optimizer, opt_runs.steps(kind), pg_collection=world.language, on_step=capture)
    finally:
        del optimizer.step
    counts = optimizer_host.cached_steps(optimizer)
    for helper in helpers:
        assert_captured(helper.stats)
        helper.delete_cuda_graphs()
    optimizer_host.uninstall(targets)
    assert not optimizer_host.installed(optimizer)
    bad = [row for row in log if row["differences"]]
    record(
        kind=kind,
        steps=len(log),
        steps_with_differences=len(bad),
        first_differences=bad[0]["differences"][:5] if bad else [],
        clipped_steps=sum(row["clipped"] for row in log),
        cached_steps=counts,
        first_loss=losses[0],
        last_loss=losses[-1],
        grad_norms=[row["grad_norm"][1] for row in log],
    )
    assert len(log) == opt_runs.STEPS
    assert not bad, f"{len(bad)} steps differ; first: step {bad[0]['step']}: {bad[0]['differences'][:5]}"
    assert all(row["success"] == (True, True) for row in log)
    assert all(row["grad_norm"][0] == row["grad_norm"][1] and row["grad_norm"][0] > 0 for row in log)
    assert all(torch.isfinite(torch.tensor(losses))), losses
    assert sum(row["clipped"] for row in log) >= opt_runs.STEPS // len(CLIPS)
    # Adam's first step and the chained step's first (before any view exists) are the host's.
    assert counts == {
        "distributed_optimizer": opt_runs.STEPS,
        "adam": opt_runs.STEPS - 1,
        "chained": opt_runs.STEPS - 1,
    }, counts
