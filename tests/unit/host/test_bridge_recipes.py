"""``bridge_cudagraph.host.bridge_recipes``: Bridge's recipe modules import without the package's ``__init__``
inside the block, and the bare package leaves ``sys.modules`` with it."""

from __future__ import annotations

import pytest

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
from bridge_cudagraph.host import bridge_recipes
NAME = bridge_recipes.BRIDGE_RECIPES
assert NAME not in sys.modules
try:
    with bridge_recipes.bridge_recipes_without_init():
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
    with bridge_recipes.bridge_recipes_without_init():
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
