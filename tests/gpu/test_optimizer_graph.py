"""Bridge's optimizer CUDA graph (``optimizer.optimizer_cuda_graph=true``) composed with our graphs, on one GPU.

The flag does two things (``results/padded-levers/optimizer_graph_probe/``): megatron-core builds TE's
``FusedAdam`` with ``capturable=True``, whose kernel rounds 1-2 fp32 ulps differently from the default one, and
Bridge's ``train()`` wraps the step in megatron-core's ``OptimizerCudaGraphWrapper``. So the faithful reference of the
graphed step is the same optimizer stepping eagerly, and the default kernel is a second, looser comparison. 30 steps
of a tiny model, our graphs captured at the warm-up step and the optimizer graph at the same step, each against:

* our graphs with the capturable optimizer stepping eagerly: identical at every step (loss and grad norm);
* graphs off with the capturable optimizer: identical (our graphs are exact, the optimizer graph is exact);
* graphs off with the default optimizer: within ``LOSS_BOUND`` and finite (the kernel's rounding, recorded), while
  that reference run again is identical to itself here.

Run under ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0`` for the exact claims (the packed vision attention backward is not
bitwise deterministic otherwise).
"""

from __future__ import annotations

import _optimizer_runs as opt_runs
import pytest

from bridge_cudagraph.testing.plans import plan_for

pytestmark = pytest.mark.gpu


def _run(world, kind: str, *, graphs: bool, capturable: bool, optimizer_graph: bool, initial=None):
    """Losses, grad norms and the helpers' stats of one 30-step run from the ``initial`` state dicts (None: this
    model's own are the initial ones, returned last)."""
    import contextlib
    import copy

    from bridge_cudagraph.examples import tiny
    from bridge_cudagraph.testing.parity import megatron_optimizer, optimizer_step_graph, train_steps

    provider = opt_runs.provider(kind, graphs)
    model = tiny.build(provider, world.language, vision_pg_collection=world.vision)
    if initial is None:
        initial = [copy.deepcopy(chunk.state_dict()) for chunk in model]
    else:
        for chunk, state in zip(model, initial, strict=True):
            chunk.load_state_dict(state, strict=True)
    optimizer = megatron_optimizer(model, world.language, optimizer_cuda_graph=capturable)
    warmup = provider.cuda_graph_warmup_steps
    helpers = []
    if graphs:
        plan = plan_for(provider, world_size=1, micro_batch_size=opt_runs.MBS, num_microbatches=1)
        helpers = provider.make_graph_helpers(model, plan=plan)

    def capture(i):
        if i == warmup:
            for helper in helpers:
                helper.create_cudagraphs()

    norms: list[float] = []
    wrap = optimizer_step_graph(optimizer, capture_at=warmup) if optimizer_graph else contextlib.nullcontext()
    with wrap:
        losses = train_steps(
            model, optimizer, opt_runs.steps(kind), pg_collection=world.language, on_step=capture, grad_norms=norms
        )
    from bridge_cudagraph.testing.parity import assert_captured

    for helper in helpers:
        assert_captured(helper.stats)  # graphs > 0, replays > 0, no failed capture: before deletion clears them
        helper.delete_cuda_graphs()
    return losses, norms, len(helpers), initial


@pytest.mark.parametrize("kind", ["gpt", "qwen3_vl"])
def test_optimizer_graph_replays_the_eager_capturable_step(world, record, kind):
    from bridge_cudagraph.testing.bounds import LOSS_BOUND
    from bridge_cudagraph.testing.parity import compare_series

    graphed, graphed_norms, helpers, initial = _run(world, kind, graphs=True, capturable=True, optimizer_graph=True)
    assert helpers == (1 if kind == "gpt" else 2)
    runs = {
        "ours_capturable_eager_step": dict(graphs=True, capturable=True, optimizer_graph=False),
        "graphs_off_capturable": dict(graphs=False, capturable=True, optimizer_graph=False),
        "graphs_off_default": dict(graphs=False, capturable=False, optimizer_graph=False),
        "graphs_off_default_again": dict(graphs=False, capturable=False, optimizer_graph=False),
    }
    out = {name: _run(world, kind, initial=initial, **kw) for name, kw in runs.items()}
    compared = {}
    for name, (losses, norms, _, _) in out.items():
        loss, norm = (
            compare_series(graphed, losses, name="loss"),
            compare_series(graphed_norms, norms, name="grad norm"),
        )
        compared[name] = (loss, norm)
        record(
            kind=kind,
            phase="optimizer_graph_vs",
            against=name,
            max_abs_loss_diff=loss.max_abs,
            exact_steps=loss.exact_steps,
            grad_norm_max_abs_diff=norm.max_abs,
            nonfinite_steps=list(loss.nonfinite_steps),
            first_loss=losses[0],
            last_loss=losses[-1],
        )
    floor = compare_series(out["graphs_off_default"][0], out["graphs_off_default_again"][0], name="loss")
    record(kind=kind, phase="default_optimizer_floor", max_abs_loss_diff=floor.max_abs, exact_steps=floor.exact_steps)
    for name in ("ours_capturable_eager_step", "graphs_off_capturable"):
        loss, norm = compared[name]
        loss.require_identical()
        norm.require_identical()
    floor.require_identical()
    compared["graphs_off_default"][0].require_within(LOSS_BOUND)
