"""The conversation recipe: Bridge's Qwen3-VL packing settings on the multi-image set, finalized and planned as
Bridge's training would; its plan's numbers written out (a change in any derivation shows up here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bridge_cudagraph.plan.from_config import plan_config
from bridge_cudagraph.recipe.load import load_recipe

YAML = Path(__file__).resolve().parents[3] / "recipes" / "tiny_qwen3_vl_conversations.yaml"


def test_recipe_reads_the_set_natively_packs_and_plans(tmp_path, monkeypatch):
    monkeypatch.setenv("BRIDGE_CUDAGRAPH_CACHE", str(tmp_path))
    loaded = load_recipe(YAML)
    cfg = loaded.config
    assert loaded.world_size == 1 and cfg.model.cuda_graph.vision.enabled and cfg.model.cuda_graph.language.enabled
    assert cfg.dataset.enable_in_batch_packing and cfg.dataset.defer_in_batch_packing_to_step
    assert cfg.dataset.num_workers == 2  # Bridge's Qwen3-VL recipes' workers
    assert (
        cfg.dataset.source.schema_adapter is None
        and Path(cfg.dataset.source.path_or_dataset, "train.parquet").is_file()
    )
    assert Path(cfg.dataset.hf_processor_path, "tokenizer.json").is_file()
    assert cfg.tokenizer.tokenizer_type == "NullTokenizer" and cfg.train.micro_batch_size == 2
    assert cfg.model.seq_length == cfg.dataset.seq_length == 8192

    plan = plan_config(loaded.config, world_size=loaded.world(), base_checkpoint_needed=False)
    packed = plan.language.packed
    assert packed is not None and packed.max_sequences == 2 and packed.separate_padded and packed.copies == 1
    assert packed.token_budgets == (
        *(1024, 1184, 1472, 1824, 2272, 2816, 3488, 4352, 5408, 6752),
        *(8416, 10496, 13120, 16384),
    )  # derived: mbs 2 x S 8192, rungs <= 1.25x apart
    assert plan.language.graphs_per_stage == (3 * 14,)
    vision = plan.vision
    assert vision is not None and vision.token_budgets == (1024, 2048, 4096, 8192, 16384) and vision.graphs == 3 * 5
    # Two samples of up to 6 images; every image 784..3920 patches on this data path.
    assert vision.max_images_per_microbatch == 12 and vision.max_patches_per_image == 3920
    assert "max images per micro-batch 12" in plan.describe()


def test_the_cli_prints_the_plan_on_cpu(tmp_path):
    """``bridge-cudagraph plan recipes/tiny_qwen3_vl_conversations.yaml`` as a user runs it, without a GPU."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "BRIDGE_CUDAGRAPH_CACHE": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "bridge_cudagraph", "plan", "recipes/tiny_qwen3_vl_conversations.yaml"],
        cwd=YAML.parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "recipe: recipes/tiny_qwen3_vl_conversations.yaml"
    for line in (
        "language: 4 layers in 3 runs x 14 budgets each (packed THD) = 42 graphs per rank,",
        "    derived: mbs 2 x S 8192 = 16384 max, 14 rungs <= 1.25x apart",
        "vision: 3 graphs x 5 budgets = 15 graphs per rank on rank 0,",
        "  budgets [1024, 2048, 4096, 8192, 16384] patches",
        "  max images per micro-batch 12",
        "  a micro-batch with more than 16384 patches or more images runs eagerly (counted)",
    ):
        assert line in lines, line
