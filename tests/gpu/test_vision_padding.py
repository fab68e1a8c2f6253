"""Where vision graphs part from eager under deterministic kernels: the graphs, or the padding to a budget?

Run 18 (2026-12-01): the main job in Bridge's ``pretrain()`` under ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0`` matched
eager at all 30 iterations with the packed language graphs alone, and parted from it at iteration 6 with the
vision graphs alone (both together: exactly the vision-only losses). Eager against eager: identical. A vision
graph replays a micro-batch of ``N`` patches at a budget ``B >= N``, the tail ``[N, B)`` zeros in its own
attention segment; if the kernels' numbers depend on the row count (a GEMM's algorithm or split over K = rows in
the weight gradient, attention's launch over the total tokens), eager on the same padded inputs differs from eager
on ``N`` rows just as the graphs do.

So this test, deterministic kernels only, on micro-batches shaped like the photo data (two photos of 320-3920
patches, the main job's budgets), checks per micro-batch:

* the graphs replay exactly what the *same layers run eagerly on the same padded static inputs* compute (loss and
  every gradient bit for bit): asserted, this is what a graph can promise;
* whether that padded computation equals eager on the unpadded rows: recorded (which micro-batches, which
  parameters, how far), the padding's own effect on the numbers.

    NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 python -m pytest tests/gpu/test_vision_padding.py -q -rA
"""

from __future__ import annotations

import os

import pytest

from bridge_cudagraph.testing.plans import plan_for

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        os.environ.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO") != "0",
        reason="bit-exact comparisons need NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 set before TE is imported",
    ),
]

SEQ = 2048
MBS = 2
BUDGETS = [1024, 2048, 4096, 8192]  # recipes/tiny_qwen3_vl_photos.yaml
MAX_IMAGES = 4
MAX_PATCHES = 3920

# One photo per sample (grids (t, h, w) in patches), as the photo set's micro-batches: every budget, 39% to 100%.
SETS = {
    "p800_b1024": [[(1, 16, 20)], [(1, 20, 24)]],
    "p1328_b2048": [[(1, 20, 28)], [(1, 24, 32)]],
    "p2048_b2048": [[(1, 32, 32)], [(1, 32, 32)]],
    "p2416_b4096": [[(1, 32, 44)], [(1, 28, 36)]],
    "p3600_b4096": [[(1, 40, 50)], [(1, 32, 50)]],
    "p4440_b8192": [[(1, 44, 60)], [(1, 36, 50)]],
    "p6000_b8192": [[(1, 56, 70)], [(1, 40, 52)]],
    "p7840_b8192": [[(1, 56, 70)], [(1, 56, 70)]],
    # The MoE tiny's deterministic photo run (its vision encoder is this one): the micro-batches it replayed at the
    # 4096 budget, in order (results/vision-padding/run64/microbatch_order.txt). The loop stayed identical to eager
    # through the first three and parted from it at the fourth (2728 patches), with no eager fallback.
    "moe_it1_p2372_b4096": [[(1, 32, 48)], [(1, 22, 38)]],
    "moe_it8_p3140_b4096": [[(1, 48, 48)], [(1, 22, 38)]],
    "moe_it9_p2944_b4096": [[(1, 40, 40)], [(1, 28, 48)]],
    "moe_it10_p2728_b4096": [[(1, 44, 44)], [(1, 22, 36)]],
    "moe_it11_p2780_b4096": [[(1, 36, 54)], [(1, 38, 22)]],
    "moe_it13_p2184_b4096": [[(1, 32, 42)], [(1, 42, 20)]],
}


def _cfg(vision: bool):
    from bridge_cudagraph.config import CudaGraphConfig, LanguageGraphConfig, VisionGraphConfig

    return CudaGraphConfig(
        language=LanguageGraphConfig(enabled=False),
        vision=VisionGraphConfig(
            enabled=vision,
            token_budgets=BUDGETS,
            max_images_per_microbatch=MAX_IMAGES,
            max_patches_per_image=MAX_PATCHES,
        ),
    )


def _build(world, vision: bool):
    from bridge_cudagraph.examples import tiny

    provider = tiny.tiny_qwen3_vl_provider(_cfg(vision), seq_length=SEQ, language_max_sequence_length=SEQ)
    return provider, tiny.build(provider, world.language, vision_pg_collection=world.vision)


def _differing(a, b) -> list[str]:
    """Gradients that differ bitwise or exist on one side only (``parity.grads_differ``)."""
    from bridge_cudagraph.testing.parity import grads_differ

    return grads_differ(a[1], b[1])


def test_vision_graphs_replay_the_padded_eager_computation(world, record):
    import torch

    from bridge_cudagraph.examples import tiny
    from bridge_cudagraph.examples.data import qwen3_vl_batch
    from bridge_cudagraph.testing.parity import assert_captured, diff, loss_and_grads, nonfinite_grads
    from tests.gpu._padded_eager import padded_eager_loss_and_grads

    provider, graphed = _build(world, True)
    _, reference = _build(world, False)
    tiny.copy_weights(graphed, reference)
    helper = next(
        h
        for h in provider.make_graph_helpers(
            graphed, plan=plan_for(provider, world_size=1, micro_batch_size=MBS, num_microbatches=1)
        )
        if h.submodule == "vision"
    )
    helper.create_cudagraphs()
    assert helper.stats.failed is None, helper.stats.failed

    padding_changes = 0
    for i, (name, images) in enumerate(SETS.items()):
        batch = qwen3_vl_batch(images, SEQ, seed=17 + i)
        patches = int(batch["image_grid_thw"].prod(-1).sum())
        budget = helper.budget_for(patches, len(images), MAX_PATCHES)
        assert budget == int(name.rsplit("_b", 1)[1]), (name, patches, budget)

        before = helper.stats.replays
        got = loss_and_grads(graphed, batch)
        assert helper.stats.replays == before + 1, f"{name} did not replay"

        # The same layers, eagerly, on the very static inputs the replay reads (same budget, same padding).
        padded = padded_eager_loss_and_grads(graphed, helper, budget, batch)
        unpadded = loss_and_grads(reference, batch)

        for what, res in (("graphs", got), ("padded eager", padded), ("eager", unpadded)):
            assert torch.isfinite(res[0]).all() and not nonfinite_grads(res[1]), what
        assert torch.equal(got[0], padded[0]), f"{name}: graphs vs padded eager: per-token loss differs"
        bad = _differing(got, padded)
        assert not bad, f"{name}: graphs vs padded eager: {len(bad)} gradients differ, e.g. {bad[:3]}"

        vs_eager = diff(padded, unpadded)
        changed = _differing(padded, unpadded)
        padding_changes += bool(changed) or not vs_eager.loss_exact
        record(
            case=name,
            patches=patches,
            budget=budget,
            fill=round(patches / budget, 3),
            graphs_equal_padded_eager=True,
            padded_equal_eager_loss=vs_eager.loss_exact,
            padded_vs_eager_grads_differing=len(changed),
            padded_vs_eager_first=changed[:4],
            padded_vs_eager_grad_max_rel_l2=vs_eager.grad_max_rel_l2,
            graphs_equal_eager=vs_eager.loss_exact and not changed,
        )
    record(case="summary", micro_batches=len(SETS), padding_changes_the_numbers=padding_changes)
    assert_captured(helper.stats)
    helper.delete_cuda_graphs()
