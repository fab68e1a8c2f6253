"""``bridge_cudagraph.recipe.load`` on CPU: every bundled recipe loads and validates offline, unknown keys are refused
with the nearest name, precedence is recipe function < YAML < command line, wrong types are refused, and the
offline Hugging Face config leaves the process as it found it."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from bridge_cudagraph.config import CudaGraphConfig, CudaGraphConfigError, UnknownKeyError
from bridge_cudagraph.plan.from_config import plan_config
from bridge_cudagraph.recipe.load import LoadedRecipe, RecipeError, load_recipe, resolve_recipe_function
from bridge_cudagraph.recipe.offline import hf_repo_id, offline_hf_config

ROOT = Path(__file__).resolve().parents[3]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
HF = ROOT / "recipes" / "hf_configs"

# Bridge's Qwen3 8B SFT recipe function sets global batch 32, micro batch 1, seq 2048: the precedence baseline.
QWEN3_8B = f"recipe: qwen3_8b_sft_config\nhf_config: {HF / 'Qwen--Qwen3-8B'}\n"
QWEN3_VL_8B = f"recipe: qwen3_vl_8b_sft_config\nhf_config: {HF / 'Qwen--Qwen3-VL-8B-Instruct'}\n"


@pytest.fixture
def write(tmp_path):
    """``write(text) -> path`` of a recipe file in a fresh folder."""

    def _write(text: str, name: str = "recipe.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return _write


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_every_bundled_recipe_loads_and_validates_on_cpu(path, tmp_path):
    """Each ``recipes/*.yaml`` loads offline, passes Bridge's own finalization and plans at its world size (a PEFT
    recipe that names no base checkpoint gets a folder, which Bridge requires and the user gives; one that names a
    base not on this machine plans without it)."""
    loaded = load_recipe(path)
    if getattr(loaded.config, "peft", None) is not None and loaded.config.checkpoint.pretrained_checkpoint is None:
        loaded.config.checkpoint.pretrained_checkpoint = str(tmp_path)
    assert isinstance(loaded, LoadedRecipe) and loaded.source == path
    block = loaded.config.model.cuda_graph
    assert isinstance(block, CudaGraphConfig) and block.any_enabled
    plan = plan_config(loaded.config, world_size=loaded.world_size or 1, base_checkpoint_needed=False)
    assert plan.language.enabled == block.language.enabled
    if plan.vision is not None:
        assert plan.vision.enabled == block.vision.enabled
    assert loaded.config.model.cuda_graph_impl == ("transformer_engine" if block.language.enabled else "none")


def test_bundled_recipes_name_the_real_models():
    """The offline config keeps Bridge's model id and pinned revision (checkpoints record them)."""
    model = load_recipe(ROOT / "recipes" / "qwen3_8b_sft_graphs.yaml").config.model
    assert model.hf_model_id == "Qwen/Qwen3-8B"
    assert model.hf_model_revision == "b968826d9c46dd6066d109eabc6255188de91218"
    vl = load_recipe(ROOT / "recipes" / "qwen3_vl_8b_sft_graphs.yaml").config.model
    assert vl.hf_model_id == "Qwen/Qwen3-VL-8B-Instruct"
    assert (vl.num_layers, vl.hidden_size, vl.vision_config.depth, vl.vision_config.out_hidden_size) == (
        36,
        4096,
        27,
        4096,
    )


class TestPrecedence:
    def test_recipe_then_yaml_then_cli(self, write):
        """Recipe function < YAML < command line, key by key."""
        base = load_recipe(write(QWEN3_8B)).config
        assert (base.train.global_batch_size, base.model.seq_length) == (32, 2048)
        yaml = write(QWEN3_8B + "train: {global_batch_size: 64}\nmodel: {seq_length: 1024}\n")
        from_yaml = load_recipe(yaml).config
        assert (from_yaml.train.global_batch_size, from_yaml.model.seq_length) == (64, 1024)
        from_cli = load_recipe(yaml, ["train.global_batch_size=128"]).config
        assert (from_cli.train.global_batch_size, from_cli.model.seq_length) == (128, 1024)

    def test_cuda_graph_block_merges_yaml_and_cli(self, write):
        """A CLI value lands inside the YAML block without resetting its other settings."""
        path = write(QWEN3_VL_8B + "model: {cuda_graph: {vision: {enabled: true, tensor_parallel_size: 2}}}\n")
        block = load_recipe(path, ["model.cuda_graph.vision.token_budgets=[1024,4096]"]).config.model.cuda_graph
        assert block.vision == type(block.vision)(enabled=True, tensor_parallel_size=2, token_budgets=[1024, 4096])
        assert type(block.vision.token_budgets) is list

    def test_values_travel_through_bridges_path(self, write):
        """Bridge's OmegaConf round trip restores callables, HF configs and dtypes; only the overrides change."""
        import torch

        cfg = load_recipe(write(QWEN3_VL_8B), ["optimizer.main_grads_dtype=bf16"]).config
        assert callable(cfg.model.activation_func)
        assert type(cfg.model.vision_config).__name__ == "Qwen3VLVisionConfig"
        assert cfg.optimizer.main_grads_dtype is torch.bfloat16
        assert type(cfg.model).__name__ == "CudaGraphQwen3VLModelProvider"


class TestUnknownKeys:
    @pytest.mark.parametrize(
        ("yaml", "message"),
        [
            (
                "model: {cuda_graph: {vision: {token_budget: [1024]}}}",
                "unknown setting model.cuda_graph.vision.token_budget (did you mean 'token_budgets'?)",
            ),
            ("trian: {global_batch_size: 64}", "unknown setting trian (did you mean 'train'?)"),
            ("model: {num_layer: 2}", "unknown setting model.num_layer (did you mean 'num_layers'?)"),
            ("train: {micro_batch: 2}", "unknown setting train.micro_batch (did you mean 'micro_batch_size'?)"),
        ],
    )
    def test_in_the_yaml(self, write, yaml, message):
        """Bridge would log 'not found ... Skipping' and run another job; we refuse with the nearest name."""
        with pytest.raises(UnknownKeyError) as info:
            load_recipe(write(QWEN3_VL_8B + yaml + "\n"))
        assert str(info.value).startswith(message), str(info.value)

    @pytest.mark.parametrize(
        ("override", "message"),
        [
            ("model.cuda_graph.language.enable=true", "model.cuda_graph.language.enable (did you mean 'enabled'?)"),
            ("+model.foo=1", "unknown setting model.foo;"),
            ("modle.seq_length=4", "unknown setting modle (did you mean 'model'?)"),
        ],
    )
    def test_on_the_command_line(self, write, override, message):
        """Command-line keys are checked the same way, ``+`` additions included."""
        with pytest.raises(UnknownKeyError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
            load_recipe(write(QWEN3_8B), [override])

    def test_long_key_lists_are_summarized(self, write):
        """A provider has hundreds of fields: the message counts them instead of listing them."""
        with pytest.raises(UnknownKeyError, match=r"valid keys of model: \d{3} settings$"):
            load_recipe(write(QWEN3_8B + "model: {hidden: 8}\n"))


class TestTypes:
    @pytest.mark.parametrize(
        ("yaml", "overrides", "error", "message"),
        [
            ("model: {cuda_graph: {language: {enabled: 'yes'}}}", [], CudaGraphConfigError, "must be true or false"),
            ("", ["model.cuda_graph.vision.token_budgets=abc"], CudaGraphConfigError, "token_budgets must be a list"),
            (
                "",
                ["model.cuda_graph.num_microbatches=0"],
                CudaGraphConfigError,
                "num_microbatches must be an integer >= 1",
            ),
            ("", ["train.micro_batch_size=two"], RecipeError, "train.micro_batch_size must be int, got str 'two'"),
            ("train: {manual_gc: 3}", [], RecipeError, "train.manual_gc must be bool, got int 3"),
            ("", ["dataset.dataloader_type=bogus"], RecipeError, "dataloader_type must be one of ['single'"),
            ("mixed_precision: {grad_reduce_in_fp32: true}", [], RecipeError, "mixed_precision is str 'bf16_mixed'"),
        ],
    )
    def test_wrong_types_are_refused(self, write, yaml, overrides, error, message):
        """Bridge would ``setattr`` any of these; we refuse with the setting's path."""
        with pytest.raises(error) as info:
            load_recipe(write(QWEN3_VL_8B + yaml + "\n"), overrides)
        assert message in str(info.value), str(info.value)

    def test_null_sub_config_is_built_from_its_settings(self, write):
        """Settings under a sub-config the recipe leaves null land on a real dataclass, not a plain dict."""
        cfg = load_recipe(write(QWEN3_8B + "comm_overlap: {tp_comm_overlap: false}\n")).config
        assert type(cfg.comm_overlap).__name__ == "CommOverlapConfig" and cfg.comm_overlap.tp_comm_overlap is False
        with pytest.raises(RecipeError, match=r"give its required setting too: comm_overlap\.tp_comm_overlap"):
            load_recipe(write(QWEN3_8B + "comm_overlap: {tp_comm_overlap_cfg: null}\n"))


class TestFileAndFunction:
    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ("model: {}\n", "'recipe:' must name a Bridge recipe function"),
            ("- a\n- b\n", "a recipe file is a mapping"),
            (QWEN3_8B + "world_size: 0\n", "world_size must be a positive integer"),
            ("recipe: qwen3_vl_8b_sft_confg\n", "did you mean 'qwen3_vl_8b_sft_config'?"),
            ("recipe: no_such_module_xyz:config\n", "cannot import no_such_module_xyz"),
            (
                "recipe: qwen3_8b_sft_config\nhf_config: missing\n",
                "does not exist (it is relative to the recipe file)",
            ),
        ],
    )
    def test_file_errors(self, write, text, message):
        """Schema errors are one-line RecipeErrors."""
        with pytest.raises(RecipeError) as info:
            load_recipe(write(text))
        assert message in str(info.value) and "\n" not in str(info.value)

    def test_missing_file(self, tmp_path):
        """A path that does not exist says so."""
        with pytest.raises(RecipeError, match="does not exist"):
            load_recipe(tmp_path / "nope.yaml")

    def test_meta_keys_are_not_overrides(self, write):
        """``world_size`` belongs to the file (or ``--world-size``), not to the ConfigContainer."""
        with pytest.raises(RecipeError, match="pass --world-size"):
            load_recipe(write(QWEN3_8B), ["world_size=4"])

    def test_module_colon_function(self):
        """``pkg.module:function`` names any recipe function."""
        assert resolve_recipe_function("bridge_cudagraph.recipe.offline:hf_repo_id") is hf_repo_id

    def test_world_size_and_description(self, write):
        """The file's meta keys come back on the LoadedRecipe."""
        loaded = load_recipe(write(QWEN3_8B + "world_size: 16\ndescription: hello\n"), ["model.seq_length=1024"])
        assert (loaded.world_size, loaded.description, loaded.recipe) == (16, "hello", "qwen3_8b_sft_config")
        assert loaded.overrides == ("model.seq_length=1024",)
        with pytest.raises(RecipeError, match="sets no world_size"):
            load_recipe(write(QWEN3_8B)).world()


class TestOffline:
    def test_state_is_restored(self):
        """Hub constants, environment and ``AutoBridge.from_hf_pretrained`` are back after the block."""
        from huggingface_hub import constants
        from megatron.bridge.models.conversion.auto_bridge import AutoBridge

        before = (constants.HF_HUB_OFFLINE, constants.HF_HUB_CACHE, dict(os.environ))
        method = AutoBridge.__dict__["from_hf_pretrained"]
        with offline_hf_config(HF / "Qwen--Qwen3-8B") as repo:
            assert repo == "Qwen/Qwen3-8B" and constants.HF_HUB_OFFLINE is True
            provider = AutoBridge.from_hf_pretrained(repo).to_megatron_provider(load_weights=False)
        assert (provider.num_layers, provider.kv_channels, provider.rotary_base) == (36, 128, 1000000)
        assert (constants.HF_HUB_OFFLINE, constants.HF_HUB_CACHE, dict(os.environ)) == before
        assert AutoBridge.__dict__["from_hf_pretrained"] is method

    def test_wrong_model_is_refused_at_once(self):
        """A recipe asking for another model fails immediately instead of retrying the Hub for minutes."""
        from megatron.bridge.models.conversion.auto_bridge import AutoBridge

        with pytest.raises(RecipeError, match="loads the Hugging Face model Qwen/Qwen3-VL-8B-Instruct"):
            with offline_hf_config(HF / "Qwen--Qwen3-8B"):
                AutoBridge.from_hf_pretrained("Qwen/Qwen3-VL-8B-Instruct")

    def test_unused_config_is_refused(self):
        """An hf_config the recipe never asks for is a mistake in the file."""
        with pytest.raises(RecipeError, match="loads no Hugging Face model"):
            with offline_hf_config(HF / "Qwen--Qwen3-8B"):
                pass

    def test_folder_names_the_model(self, tmp_path):
        """``Org--Name`` folders, nothing else."""
        assert hf_repo_id("x/Qwen--Qwen3-VL-8B-Instruct") == "Qwen/Qwen3-VL-8B-Instruct"
        with pytest.raises(RecipeError, match="must be named <Org>--<Name>"):
            hf_repo_id(tmp_path / "qwen3")
