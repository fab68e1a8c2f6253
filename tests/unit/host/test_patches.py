"""``bridge_cudagraph.host.patches``: every patch of the host is in effect inside its block (or between install and
uninstall) and undone after it: the host attribute is the very object it was before, also when the block raises."""

from __future__ import annotations

import importlib.util
import os
import types

import pytest
import torch

from bridge_cudagraph.bridge import loop as bridge_loop
from bridge_cudagraph.host import compat
from bridge_cudagraph.host import patches as host_patches


class Boom(Exception):
    """Raised inside a patched block: the undo must still run."""


def _leave(context, raising: bool) -> None:
    if raising:
        with pytest.raises(Boom), context:
            raise Boom
    else:
        with context:
            pass


def test_bridge_helper_install_and_uninstall():
    train = compat.bridge_train_module()
    host_patches.uninstall_bridge_helper()
    real = train.TECudaGraphHelper
    bridge_loop.install_bridge_helper()
    try:
        assert train.TECudaGraphHelper is not real and issubclass(train.TECudaGraphHelper, real)
        assert getattr(train.TECudaGraphHelper, host_patches.ORIGINAL) is real
        assert host_patches.bridge_helper_installed()
    finally:
        host_patches.uninstall_bridge_helper()
    assert train.TECudaGraphHelper is real and not host_patches.bridge_helper_installed()
    host_patches.uninstall_bridge_helper()  # a second uninstall changes nothing
    assert train.TECudaGraphHelper is real


@pytest.mark.parametrize("raising", [False, True], ids=["returns", "raises"])
def test_training_loop_wrapper_is_undone(raising):
    def loop():
        return "trained"

    module = types.ModuleType("pretrain_like")
    module.train = loop
    released = []
    owner = types.SimpleNamespace(release_graphs=lambda reason: released.append(reason))
    with host_patches.release_graphs_if_training_raises(owner, module):
        assert module.train is not loop and getattr(module.train, host_patches.ORIGINAL) is loop
        assert module.train() == "trained" and released == []
    assert module.train is loop
    _leave(host_patches.release_graphs_if_training_raises(owner, module), raising)
    assert module.train is loop


@pytest.mark.skipif(
    importlib.util.find_spec("nvidia_resiliency_ext") is None,
    reason="megatron.bridge.training.pretrain imports nvidia_resiliency_ext, which only the GPU machine has",
)
def test_training_loop_wrapper_is_undone_on_bridges_own_module():
    pretrain = importlib.import_module("megatron.bridge.training.pretrain")
    real = pretrain.train
    with host_patches.release_graphs_if_training_raises(types.SimpleNamespace(release_graphs=lambda reason: None)):
        assert pretrain.train is not real
    assert pretrain.train is real


def test_prebuilt_dataset_helpers_are_undone():
    from megatron.bridge.training import initialize

    host_patches.restore_dataset_helpers()  # another test's train.run() may have left it in place
    original = initialize.compile_helpers
    applied = host_patches.use_prebuilt_dataset_helpers()
    try:
        assert applied == compat.dataset_helpers_prebuilt_without_makefile()
        if applied:
            assert initialize.compile_helpers is not original
            assert getattr(initialize.compile_helpers, host_patches.ORIGINAL) is original
            initialize.compile_helpers()  # the prebuilt module imports: no make, no sys.exit
            assert host_patches.use_prebuilt_dataset_helpers()  # idempotent: wraps nothing twice
            assert getattr(initialize.compile_helpers, host_patches.ORIGINAL) is original
        else:
            assert initialize.compile_helpers is original
    finally:
        host_patches.restore_dataset_helpers()
    assert initialize.compile_helpers is original


@pytest.mark.parametrize("raising", [False, True], ids=["returns", "raises"])
def test_offline_hub_is_undone(tmp_path, monkeypatch, raising):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_CACHE", "/somewhere/else")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    before = (constants.HF_HUB_OFFLINE, constants.HF_HUB_CACHE)
    env = dict(os.environ)
    with host_patches.offline_hub(tmp_path):
        assert constants.HF_HUB_OFFLINE is True and constants.HF_HUB_CACHE == str(tmp_path)
        assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["HF_HUB_CACHE"] == str(tmp_path)
    _leave(host_patches.offline_hub(tmp_path), raising)
    assert constants.HF_HUB_OFFLINE is before[0] and constants.HF_HUB_CACHE is before[1]
    assert dict(os.environ) == env


@pytest.mark.parametrize("raising", [False, True], ids=["returns", "raises"])
def test_from_hf_pretrained_hook_is_undone(raising):
    from megatron.bridge.models.conversion.auto_bridge import AutoBridge

    original = AutoBridge.__dict__["from_hf_pretrained"]
    seen = []

    def refuse(path, kwargs):
        seen.append((path, kwargs))
        raise Boom  # before Bridge's own code, so nothing reaches the Hub

    with host_patches.from_hf_pretrained_hook(refuse):
        assert AutoBridge.__dict__["from_hf_pretrained"] is not original
        with pytest.raises(Boom):
            AutoBridge.from_hf_pretrained("Org/Model", revision="abc")
    assert seen == [("Org/Model", {"revision": "abc"})]
    _leave(host_patches.from_hf_pretrained_hook(refuse), raising)
    assert AutoBridge.__dict__["from_hf_pretrained"] is original


@pytest.mark.parametrize("raising", [False, True], ids=["returns", "raises"])
def test_cpu_device_properties_are_undone(raising):
    original = torch.cuda.get_device_properties
    with host_patches.cpu_device_properties():
        if torch.cuda.is_available():
            assert torch.cuda.get_device_properties is original  # nothing to stand in for
        else:
            assert torch.cuda.get_device_properties is not original
            assert torch.cuda.get_device_properties(0).total_memory == 0
    _leave(host_patches.cpu_device_properties(), raising)
    assert torch.cuda.get_device_properties is original


@pytest.mark.parametrize("raising", [False, True], ids=["returns", "raises"])
def test_explicit_num_microbatches_is_undone(raising):
    from megatron.core.transformer import cuda_graphs

    original = cuda_graphs.get_num_microbatches
    with host_patches.explicit_num_microbatches(7):
        assert cuda_graphs.get_num_microbatches() == 7
    _leave(host_patches.explicit_num_microbatches(3), raising)
    assert cuda_graphs.get_num_microbatches is original


@pytest.mark.parametrize("raising", [False, True], ids=["returns", "raises"])
def test_listed_reset_modules_is_undone(raising):
    import importlib

    host = importlib.import_module("megatron.core.distributed.finalize_model_grads")
    original = host.reset_model_temporary_tensors
    with host_patches.listed_reset_modules([object()], [[]]):
        assert getattr(host.reset_model_temporary_tensors, host_patches.ORIGINAL) is original
    _leave(host_patches.listed_reset_modules([object()], [[]]), raising)
    assert host.reset_model_temporary_tensors is original


# A child process: whether megatron.bridge.recipes is imported depends on what ran before in this one. With
# BLOCK_DIFFUSERS, `diffusers` cannot be imported, as on the GPU machine's image.
_RECIPES_CHILD = """
import importlib.abc, sys
if "BLOCK_DIFFUSERS" in sys.argv:
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] == "diffusers":
                raise ImportError("no diffusers here")
    sys.meta_path.insert(0, Block())
from bridge_cudagraph.host import patches as host_patches
NAME = host_patches.BRIDGE_RECIPES
assert NAME not in sys.modules
try:
    with host_patches.bridge_recipes_without_init():
        bare = sys.modules[NAME]
        from megatron.bridge.recipes.qwen_vl.h100.qwen3_vl import qwen3_vl_8b_peft_1gpu_h100_bf16_config as f
        assert not hasattr(bare, "qwen3_vl_8b_sft_config")  # the package's __init__ (its re-exports) never ran
        raise RuntimeError("leave the block by an exception")
except RuntimeError:
    pass
assert NAME not in sys.modules, "the bare package outlived the block"
assert callable(f) and f.__module__ == "megatron.bridge.recipes.qwen_vl.h100.qwen3_vl"
try:
    import megatron.bridge.recipes as real
except ImportError as error:
    print("real package:", type(error).__name__, error)
else:
    assert real is not bare and callable(real.qwen3_vl_8b_sft_config)  # the real __init__ ran over the submodules
    with host_patches.bridge_recipes_without_init():
        assert sys.modules[NAME] is real  # already imported: nothing patched
    assert sys.modules[NAME] is real
    print("real package: imported")
"""


@pytest.mark.parametrize("diffusers", ["installed", "absent"])
def test_bridge_recipes_without_init_is_undone(diffusers):
    """Bridge's recipe module imports inside the block, also without ``diffusers`` (where the package's own
    ``__init__`` fails); the bare package leaves ``sys.modules`` with the block, even by an exception, and the real
    ``__init__`` runs on a later import; an imported package is left as it is."""
    import importlib.util
    import subprocess
    import sys

    if diffusers == "installed" and importlib.util.find_spec("diffusers") is None:
        # The device machine's stack (run 24) has no diffusers: "absent" is then the case that machine runs.
        pytest.skip("diffusers is not installed here: only the 'absent' case can run")
    args = [sys.executable, "-c", _RECIPES_CHILD] + (["BLOCK_DIFFUSERS"] if diffusers == "absent" else [])
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    if diffusers == "absent":
        assert last == "real package: ImportError no diffusers here"
    else:
        assert last == "real package: imported"


def test_nothing_else_in_the_package_rebinds_these_names():
    """The patched names are assigned in host_patches only (the one place to re-read on an upgrade)."""
    import bridge_cudagraph

    names = (
        ".TECudaGraphHelper =",
        ".train = ",
        ".compile_helpers =",
        "HF_HUB_OFFLINE =",
        "HF_HUB_CACHE =",
        ".from_hf_pretrained =",
        ".get_device_properties =",
        ".get_num_microbatches =",
        ".reset_model_temporary_tensors =",
        "sys.modules[",
    )
    root = os.path.dirname(bridge_cudagraph.__file__)
    offenders = []
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            if not name.endswith(".py") or path == host_patches.__file__:
                continue
            with open(path) as f:
                text = f.read()
            offenders += [f"{os.path.relpath(path, root)}: {n}" for n in names if n in text]
    assert not offenders, offenders


def test_instance_mixins_come_off_in_either_order():
    """Two owners extend one object's class (the packed replay's decoder mixin, the forward's deepstack one): each
    takes its own off, in either order, and the other stays; both off gives the host class back."""

    class Host:
        def who(self):
            return ["host"]

    class First:
        def who(self):
            return ["first", *super().who()]

    class Second:
        def who(self):
            return ["second", *super().who()]

    for off in ((First, Second), (Second, First)):
        obj = Host()
        host_patches.extend_instance_class(obj, First)
        host_patches.extend_instance_class(obj, Second)
        assert obj.who() == ["second", "first", "host"]
        host_patches.restore_instance_class(obj, off[0])
        assert obj.who() == [off[1].__name__.lower(), "host"]
        assert isinstance(obj, off[1]) and not isinstance(obj, off[0])
        host_patches.restore_instance_class(obj, off[1])
        assert type(obj) is Host
        host_patches.restore_instance_class(obj, off[1])  # idempotent
        assert type(obj) is Host


def test_bridge_collection_is_completed_and_restored():
    """The GTP_remat fields Bridge leaves unset become the very groups of their plain fields, only where unset, and
    the undo leaves them unset again; with GTP_remat on nothing is aliased (the plain group would be wrong)."""
    from megatron.core.process_groups_config import ProcessGroupCollection

    assert compat.collection_declares_gtp_remat_groups()  # megatron-core 0.19.2 (TESTED_STACK)
    dp_cp, expt_dp, tp_ep_pp, own = object(), object(), object(), object()
    pgc = ProcessGroupCollection(dp_cp=dp_cp, expt_dp=expt_dp, tp_ep_pp=tp_ep_pp, expt_dp_gtp_remat=own)
    assert pgc.dp_cp_gtp_remat is None  # unset reads as None: what megatron-core's MoE logging then falls back on
    config = types.SimpleNamespace(gtp_weight_remat_size=1, expert_gtp_weight_remat_size=1)
    assert host_patches.complete_bridge_collection(pgc, config) == ("dp_cp_gtp_remat", "tp_ep_pp_with_egtp_remat")
    assert pgc.dp_cp_gtp_remat is dp_cp and pgc.tp_ep_pp_with_egtp_remat is tp_ep_pp
    assert pgc.expt_dp_gtp_remat is own  # set by whoever built it: kept
    assert host_patches.complete_bridge_collection(pgc, config) == ()  # idempotent
    host_patches.restore_bridge_collection(pgc)
    assert "dp_cp_gtp_remat" not in vars(pgc) and "tp_ep_pp_with_egtp_remat" not in vars(pgc)
    assert pgc.dp_cp_gtp_remat is None and pgc.expt_dp_gtp_remat is own and pgc.dp_cp is dp_cp
    host_patches.restore_bridge_collection(pgc)  # a second undo changes nothing
    assert pgc.expt_dp_gtp_remat is own

    bare = ProcessGroupCollection(tp=object())  # no plain groups: nothing to alias, nothing set
    assert host_patches.complete_bridge_collection(bare, config) == () and "dp_cp_gtp_remat" not in vars(bare)

    for gtp in ("gtp_weight_remat_size", "expert_gtp_weight_remat_size"):
        on = types.SimpleNamespace(**{**vars(config), gtp: 2})
        fresh = ProcessGroupCollection(dp_cp=dp_cp, expt_dp=expt_dp, tp_ep_pp=tp_ep_pp)
        with pytest.raises(RuntimeError, match=f"model.{gtp}=2"):
            host_patches.complete_bridge_collection(fresh, on)
        assert "dp_cp_gtp_remat" not in vars(fresh)
