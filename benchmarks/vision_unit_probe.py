"""Which vision parameters' gradients move when several layers share one graph? Issue #18.

Run 30 (2026-12-01, H200): one graph over the whole tiny encoder (4 layers, deepstack layers 1 and 2, whose outputs the
graph also returned) replayed the per-token loss bit-exactly but not every gradient (worst relative L2 5.5e-3, layer
0's MLP norm weight), while one graph per layer stayed bit-exact. Run 31 ran this probe with that unit (then called
``encoder``) and the two that remain: the whole-stack graph moved 39 vision gradients (layers 0-2 and the patch
embedding, the layers whose gradient passes a deepstack layer) by 4-5e-3, the same with deterministic kernels; graphs
cut after each deepstack layer (``run``, then called ``deepstack``) and one per layer moved none, and eager against
eager moved none (``results/padded-levers/vision_unit_probe/``). The cause: a deepstack layer's output is read by the
next layer (twice: its norm and the residual) and by a merger; inside one graph autograd sums those three gradient
parts in another order than eager's per-layer backward does. So no graph spans a deepstack layer.

This probe trains nothing: for each remaining unit it captures the tiny encoder's graphs and prints, for two
micro-batches, every vision parameter whose gradient differs from the eager reference's, with its relative L2,
and eager against eager (the floor).

    python -m benchmarks.vision_unit_probe
"""

from __future__ import annotations

import json

SETS = {
    "one_image_256": [[(1, 8, 8)], []],
    "three_images_512": [[(1, 8, 8), (1, 12, 8)], [(1, 16, 12)]],
}


def main() -> int:
    """Print the report as JSON; exit 0."""
    import torch

    from bridge_cudagraph.config import CudaGraphConfig, VisionGraphConfig
    from bridge_cudagraph.examples import tiny
    from bridge_cudagraph.examples.data import qwen3_vl_batch
    from bridge_cudagraph.parallel.layout import VisionLayout
    from bridge_cudagraph.testing.parity import loss_and_grads
    from bridge_cudagraph.testing.plans import plan_for
    from bridge_cudagraph.testing.world import init_world

    world = init_world(vision=VisionLayout(), seed=1234)
    reference = tiny.build(tiny.tiny_qwen3_vl_provider(None), world.language, vision_pg_collection=world.vision)
    batches = {name: qwen3_vl_batch(images, 256, seed=11) for name, images in SETS.items()}
    eager = {name: loss_and_grads(reference, b) for name, b in batches.items()}
    again = {name: loss_and_grads(reference, b) for name, b in batches.items()}

    def moved(a, b):
        out = {}
        for name, gb in b[1].items():
            if "vision_model" not in name or torch.equal(a[1][name], gb):
                continue
            out[name.replace("module.module.vision_model.", "")] = float(
                (a[1][name] - gb).norm() / gb.norm().clamp(min=1e-12)
            )
        return {"loss_exact": bool(torch.equal(a[0], b[0])), "grads_moved": out}

    report = {"eager_vs_eager": {n: moved(again[n], eager[n]) for n in batches}}
    for unit in ("run", "layer"):
        cfg = CudaGraphConfig(
            vision=VisionGraphConfig(
                enabled=True, token_budgets=[256, 512, 1024], max_images_per_microbatch=8, graph_unit=unit
            )
        )
        provider = tiny.tiny_qwen3_vl_provider(cfg)
        graphed = tiny.build(provider, world.language, vision_pg_collection=world.vision)
        tiny.copy_weights(reference, graphed)
        helpers = provider.make_graph_helpers(
            graphed, plan=plan_for(provider, world_size=1, micro_batch_size=2, num_microbatches=1)
        )
        helper = next(h for h in helpers if h.submodule == "vision")
        helper.create_cudagraphs()
        report[unit] = {
            "graphs": helper.stats.graphs,
            "segments": [list(s) for s in helper.segments],
            **{n: moved(loss_and_grads(graphed, b), eager[n]) for n, b in batches.items()},
            "replays": helper.stats.replays,
        }
        helper.delete_cuda_graphs()
        del graphed, helpers, helper
        torch.cuda.empty_cache()
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
