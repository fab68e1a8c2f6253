"""Draft of next_draft.sh's call E (not yet run): does the graphs-off MoE model's per-token loss of the first token
count a process sees move once other token counts have run, with no CUDA graph anywhere?

Runs 91-93 (results/moe/) found the packed MoE suite's first batch (30% fill, 320 tokens) 1 fp32 ulp off on 15 tokens
after the capture, every gradient identical, in the graphs-off model too. The suspected cause is megatron-core's fused
cross entropy (``jit_fuser`` = ``torch.compile``; Bridge's providers set ``cross_entropy_loss_fusion``): compiled for
the first shape, recompiled shape-generic at the second (torch's automatic dynamic shapes). This script runs the three
batches of ``tests/gpu/test_packed_moe.py`` in order, then the first again, and prints which tokens moved, in three
fresh processes: as is; with ``torch._dynamo.config.automatic_dynamic_shapes = False`` (every shape its own static
kernel); and with ``cross_entropy_loss_fusion=False`` (no compiled loss). The hypothesis holds if only the first
process moves. Copy it to .snap/ with next_draft.sh (results/ stays out of the call) and run from the repository root:

    python3 .snap/eager_shapes_draft.py {as_is,static_shapes,no_ce_fusion}
"""

from __future__ import annotations

import json
import sys


def main(mode: str) -> dict:
    """One process's answer for ``mode`` (a fresh process each: torch.compile's caches are per process)."""
    import torch

    if mode == "static_shapes":
        import torch._dynamo

        torch._dynamo.config.automatic_dynamic_shapes = False
    from bridge_cudagraph.examples import tiny
    from bridge_cudagraph.parallel.layout import VisionLayout
    from bridge_cudagraph.testing.parity import loss_and_grads
    from bridge_cudagraph.testing.world import close_world, init_world
    from tests.gpu.test_packed_moe import CASES, SEQ, _packed_batch

    world = init_world(vision=VisionLayout())
    fields = dict(seq_length=SEQ, language_max_sequence_length=SEQ, moe=True, moe_z_loss_coeff=1e-3)
    provider = tiny.tiny_qwen3_vl_provider(None, **fields)
    if mode == "no_ce_fusion":
        provider.cross_entropy_loss_fusion = False
    model = tiny.build(provider, world.language, vision_pg_collection=world.vision)
    batches = {
        name: _packed_batch(rows, seed=17 * i, pg_collection=world.language)
        for i, (name, rows) in enumerate(CASES.items())
    }
    first = {name: loss_and_grads(model, batch) for name, batch in batches.items()}
    name = next(iter(batches))
    again = loss_and_grads(model, batches[name])
    a, b = first[name][0].flatten(), again[0].flatten()
    moved = (a != b).nonzero().flatten().tolist()
    grads_equal = all(
        (g is None and first[name][1][k] is None) or torch.equal(g, first[name][1][k]) for k, g in again[1].items()
    )
    close_world(world)
    return {
        "mode": mode,
        "gpu": torch.cuda.get_device_name(),
        "batch": name,
        "tokens": a.numel(),
        "moved_tokens": len(moved),
        "max_abs": float((a - b).abs().max()) if moved else 0.0,
        "first_moved": moved[:8],
        "grads_equal": grads_equal,
        "cross_entropy_loss_fusion": bool(provider.cross_entropy_loss_fusion),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1] if len(sys.argv) > 1 else "as_is")))
