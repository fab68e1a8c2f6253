"""The MoE tiny recipe's first 14 training micro-batches as run 64 drew them (CPU; Bridge's own dataset provider,
collate and cyclic sampler, 28 training samples as 14 iterations of global batch 2 ask for), and the vision shapes
each gives: the frames' patch counts, the vision budget it replays in, the graphs' static max_seqlen and eager's.

The order is checked against run 64's log: the per-step loss tokens summed here give the cumulative "tokens with loss"
of its useful-tokens lines (329, 467, 941, 1194, 1734 at iterations 6-10). Run from the repository root:
    python results/run64/microbatch_order.py > results/run64/microbatch_order.txt
"""

from megatron.bridge.data.samplers import MegatronPretrainingRandomSampler
from megatron.bridge.data.utils import get_dataset_provider

from bridge_cudagraph.examples.photo_recipe import tiny_qwen3_vl_moe_photos_config

ITERS, MBS, BUDGETS, MAX_PATCHES = 14, 2, [1024, 2048, 4096, 8192], 3920

cfg = tiny_qwen3_vl_moe_photos_config()
train, _, _ = get_dataset_provider(cfg.dataset)([ITERS * MBS, 0, 0], cfg.dataset, tokenizer=None)
sampler = MegatronPretrainingRandomSampler(
    train,
    total_samples=len(train),
    consumed_samples=0,
    micro_batch_size=MBS,
    data_parallel_rank=0,
    data_parallel_size=1,
    data_sharding=True,
)
print(
    "iteration | samples | loss tokens | image grids (t, h, w) | patches per frame | total | budget | "
    "static max_seqlen | eager max_seqlen"
)
for it, idx in enumerate(sampler, 1):
    if it > ITERS:
        break
    batch = train.collate_fn([train[i] for i in idx])
    grid = batch["visual_inputs"].image_grid_thw
    frames = [int(h * w) for t, h, w in grid.tolist() for _ in range(int(t))]
    budget = min(b for b in BUDGETS if b >= sum(frames))
    print(
        it,
        "|",
        idx,
        "|",
        int(batch["loss_mask"].sum()),
        "|",
        grid.tolist(),
        "|",
        frames,
        "|",
        sum(frames),
        "|",
        budget,
        "|",
        min(budget, MAX_PATCHES),
        "|",
        max(frames),
    )
