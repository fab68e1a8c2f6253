"""The 8B LoRA photo recipe: Bridge's ``qwen3_vl_8b_peft_1gpu_h100_bf16_config`` with only the offline changes, the
processor's token ids on the provider, and ``validate`` / ``plan`` / ``train`` on a CPU machine with no arguments."""

from __future__ import annotations

import copy
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _processes import awaited

from bridge_cudagraph.examples.peft8b_recipe import BRIDGE_RECIPE, random_base_dir
from bridge_cudagraph.plan.from_config import plan_config
from bridge_cudagraph.recipe.load import load_recipe

ROOT = Path(__file__).resolve().parents[3]
YAML = ROOT / "recipes" / "qwen3_vl_8b_peft_photos_graphs.yaml"
HF = ROOT / "recipes" / "hf_configs" / "Qwen--Qwen3-VL-8B-Instruct"

# What the recipe function and the YAML change in Bridge's recipe, and nothing else (model.cuda_graph: the block).
CHANGED = {
    "checkpoint.pretrained_checkpoint",  # the random base (examples/random_base.py)
    "checkpoint.save",  # the YAML: no save, no resume
    "checkpoint.load",
    "dataset.hf_processor_path",  # the offline processor folder
    "dataset.source.path_or_dataset",  # the local photo set, read with the cord_v2 adapter
    "dataset.source.dataset_name",
    "dataset.source.schema_adapter",
    "dataset.source.split",
    "dataset.source.adapter_kwargs",
    "model.image_token_id",  # the processor's
    "model.video_token_id",
    "model.vision_start_token_id",
    "model.vision_end_token_id",
    "model.cuda_graph",
    "model.gradient_accumulation_fusion",  # the YAML: off, LoRA freezes the TE weights the fusion serves
}
LANGUAGE_BUDGETS = (512, 768, 1024, 1280, 1536, 1792, 2048, 2304, 2560)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One photo set, processor and (absent) base checkpoint folder for the module, in a fresh cache."""
    folder = tmp_path_factory.mktemp("cache")
    saved = os.environ.get("BRIDGE_CUDAGRAPH_CACHE")
    os.environ["BRIDGE_CUDAGRAPH_CACHE"] = str(folder)
    yield folder
    if saved is None:
        os.environ.pop("BRIDGE_CUDAGRAPH_CACHE", None)
    else:
        os.environ["BRIDGE_CUDAGRAPH_CACHE"] = saved


@pytest.fixture(scope="module")
def loaded(cache):
    return load_recipe(YAML)


# A child process with diffusers made unimportable, as on the GPU machine's image.
_NO_DIFFUSERS = (
    "import importlib.abc, sys\n"
    "class Block(importlib.abc.MetaPathFinder):\n"
    "    def find_spec(self, name, path, target=None):\n"
    "        if name.split('.')[0] == 'diffusers':\n"
    "            raise ImportError('no diffusers here')\n"
    "sys.meta_path.insert(0, Block())\n"
    "from bridge_cudagraph.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)

# A child process whose CUDA driver shows a GPU (as the GPU machine's): `train` gets past its early driver check, to
# the recipe's own checks, which come before torch's.
_DRIVER_SHOWS_A_GPU = (
    "import sys\n"
    "import bridge_cudagraph.cli as cli\n"
    "cli.cuda_device_count = lambda: (1, '')\n"
    "sys.exit(cli.main(sys.argv[1:]))\n"
)


@pytest.fixture(scope="module")
def cli(cache):
    """The three verbs on the recipe with no arguments, started at once (each imports the stack)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "BRIDGE_CUDAGRAPH_CACHE": str(cache)}
    recipe = str(YAML.relative_to(ROOT))

    def start(*argv: str) -> subprocess.Popen:
        return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    started = {
        "validate": start(sys.executable, "-m", "bridge_cudagraph", "validate", recipe),
        "plan": start(sys.executable, "-c", _NO_DIFFUSERS, "plan", recipe),
        "train": start(sys.executable, "-c", _DRIVER_SHOWS_A_GPU, "train", recipe),
    }
    with awaited(started) as result:
        yield result


def _tree(cfg) -> dict:
    from megatron.bridge.training.utils.omegaconf_utils import create_omegaconf_dict_config
    from omegaconf import OmegaConf

    return OmegaConf.to_container(create_omegaconf_dict_config(cfg)[0])


def _differences(ours, theirs, path="") -> set[str]:
    if isinstance(ours, dict) and isinstance(theirs, dict):
        found = set()
        for key in set(ours) | set(theirs):
            found |= _differences(ours.get(key, "<absent>"), theirs.get(key, "<absent>"), f"{path}{key}.")
        return found
    return set() if ours == theirs else {path.rstrip(".")}


def test_it_is_bridges_recipe_with_only_the_offline_changes(loaded):
    """Field by field against Bridge's own recipe function (imported the ordinary way here): what differs is the
    data source, the processor, the token ids, the base checkpoint and no save/resume; LoRA, sizes, optimizer,
    DDP, precision and the rest are Bridge's."""
    from bridge_cudagraph.recipe.load import resolve_recipe_function
    from bridge_cudagraph.recipe.offline import recipe_environment

    with recipe_environment(HF):
        bridge = resolve_recipe_function(BRIDGE_RECIPE)()
    ours = loaded.config
    assert _differences(_tree(ours), _tree(bridge)) == CHANGED
    lora = ours.peft
    assert type(lora).__name__ == "LoRA" and (lora.dim, lora.alpha) == (32, 32)
    assert lora.target_modules == ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]
    assert (ours.model.seq_length, ours.dataset.seq_length, ours.model.tensor_model_parallel_size) == (4096, 4096, 1)
    assert (ours.train.micro_batch_size, ours.train.global_batch_size) == (2, 32)
    assert (ours.optimizer.lr, ours.scheduler.lr_warmup_iters) == (1e-4, 500)
    assert (ours.model.num_layers, ours.model.hidden_size, ours.model.vision_config.depth) == (36, 4096, 27)
    assert ours.model.hf_model_id == "Qwen/Qwen3-VL-8B-Instruct"
    data = ours.dataset
    assert type(data).__name__ == "DirectHFSFTDatasetConfig" and data.source.schema_adapter == "cord_v2"
    assert data.enable_in_batch_packing and data.defer_in_batch_packing_to_step
    assert ours.checkpoint.pretrained_checkpoint == str(random_base_dir(1234))


def test_the_token_ids_are_the_processors_and_fit_the_8b_vocabulary(loaded):
    """The ids the provider splices images at are the ones the processor folder writes, and every token the
    collate makes has a row in the 8B embedding table; checked on a micro-batch of Bridge's own dataset and collate."""
    from megatron.bridge.data.utils import get_dataset_provider
    from transformers import AutoProcessor

    cfg = loaded.config
    model = cfg.model
    processor = AutoProcessor.from_pretrained(cfg.dataset.hf_processor_path)
    ids = processor.tokenizer.convert_tokens_to_ids(
        ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"]
    )
    assert ids == [
        model.image_token_id,
        model.video_token_id,
        model.vision_start_token_id,
        model.vision_end_token_id,
    ]
    assert (processor.image_token_id, processor.video_token_id) == (model.image_token_id, model.video_token_id)
    assert len(processor.tokenizer) <= model.vocab_size == 151936

    train, _, _ = get_dataset_provider(cfg.dataset)([4, 0, 0], cfg.dataset, tokenizer=None)
    batch = train.collate_fn([train[0], train[1]])
    tokens = batch["input_ids"]
    assert int(tokens.max()) < model.vocab_size
    assert (tokens == model.vision_start_token_id).sum(1).tolist() == [1, 1]  # one photo per sample
    assert (tokens == model.vision_end_token_id).sum(1).tolist() == [1, 1]
    assert (tokens == model.image_token_id).sum() > 0


def test_it_plans_the_packed_graphs_on_one_gpu(loaded):
    """The plan of the recipe: 4 runs of the 36 layers (0, 1, 2, 3-35: a deepstack merge follows each of the first
    3) x the data path's 9 packed widths, 4 vision graphs per budget (cut after the deepstack layers 8, 16, 24), 16
    micro-batches per step, capture after Bridge's 3 warm-up steps; the base checkpoint's path is kept."""
    cfg = dataclasses.replace(loaded, config=copy.deepcopy(loaded.config))
    plan = plan_config(cfg.config, world_size=cfg.world(), base_checkpoint_needed=False)
    packed = plan.language.packed
    assert packed is not None and packed.token_budgets == LANGUAGE_BUDGETS and not packed.budgets_derived
    assert (packed.max_sequences, packed.max_seqlen, packed.copies) == (2, 4096, 1)
    assert plan.language.segments_per_stage == (((0, 1), (1, 2), (2, 3), (3, 36)),)
    assert plan.language.graphs == 4 * 9 and plan.language.warmup_steps == 3
    vision = plan.vision
    assert vision is not None and vision.token_budgets == (1024, 2048, 4096, 8192) and vision.graphs == 4 * 4
    assert (vision.max_images_per_microbatch, vision.max_patches_per_image) == (4, 3920)
    assert (plan.world_size, plan.micro_batch_size, plan.num_microbatches) == (1, 2, 16)
    assert cfg.config.checkpoint.pretrained_checkpoint == loaded.config.checkpoint.pretrained_checkpoint
    assert cfg.config.model.cuda_graph_impl == "transformer_engine"


def test_the_base_checkpoint_is_needed_by_train_not_by_the_plan(loaded):
    """Bridge's own check of the base checkpoint stays in force for a run (``base_checkpoint_needed=True``)."""
    run = dataclasses.replace(loaded, config=copy.deepcopy(loaded.config))
    with pytest.raises(AssertionError, match="does not exist"):
        plan_config(run.config, world_size=run.world(), base_checkpoint_needed=True)


def test_validate_needs_no_arguments(cli):
    code, out, err = cli("validate")
    assert code == 0, err[-3000:]
    base = random_base_dir(1234, Path(os.environ["BRIDGE_CUDAGRAPH_CACHE"]))
    assert out == (
        "ok: recipes/qwen3_vl_8b_peft_photos_graphs.yaml at 1 GPU: language 36 + vision 16 graphs per rank, "
        f"16 micro-batches per step; checkpoint.pretrained_checkpoint={base} is not on this machine (train needs it)\n"
    )


def test_plan_needs_no_arguments_and_no_diffusers(cli):
    """``plan`` with ``diffusers`` unimportable, as on the GPU machine: Bridge's recipe module imports without the
    ``megatron.bridge.recipes`` package's ``__init__``."""
    code, out, err = cli("plan")
    assert code == 0, err[-3000:]
    lines = out.splitlines()
    base = random_base_dir(1234, Path(os.environ["BRIDGE_CUDAGRAPH_CACHE"]))
    at = lines.index(
        f"  checkpoint.pretrained_checkpoint={base} is not on this machine: a plan does not read the base checkpoint; "
        "train needs it"
    )
    i = lines.index("language: 36 layers in 4 runs x 9 budgets each (packed THD) = 36 graphs per rank,")
    assert lines[i + 1] == "  whole layers, capture after 3 steps (model.cuda_graph_warmup_steps)"
    assert "  budgets [512, 768, 1024, 1280, 1536, 1792, 2048, 2304, 2560] tokens" in lines
    assert lines[-1].startswith("busiest rank: 52 graphs")
    assert max(len(line) for i, line in enumerate(lines) if i != at) <= 119  # the path may be longer


def test_train_refuses_without_the_base_checkpoint_and_says_how_to_build_it(cli):
    """Before its GPU check (past the driver's, as on a GPU machine), ``train`` refuses the absent base in one line
    that names the builder."""
    code, out, err = cli("train")
    assert code == 2 and "Traceback" not in err + out, err[-3000:]
    base = random_base_dir(1234, Path(os.environ["BRIDGE_CUDAGRAPH_CACHE"]))
    assert err.rstrip("\n").splitlines()[-1] == (
        f"error: checkpoint.pretrained_checkpoint={base} does not exist on this machine: Bridge's fine-tuning loads "
        "the base weights from it (PEFT before applying the adapters); give an existing Megatron or Hugging Face "
        "checkpoint, or build one with random weights: python -m bridge_cudagraph.examples.random_base "
        "recipes/qwen3_vl_8b_peft_photos_graphs.yaml"
    )
