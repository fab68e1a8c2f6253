"""bridge_cudagraph: faithful per-layer CUDA graphs (Transformer Engine) for Megatron-Bridge, on the language model
and the vision encoder, each under its own explicit process groups (megatron-core ``ProcessGroupCollection``).

Naming: classes are ``CudaGraph*``, recipe fields ``cuda_graph*`` (the one YAML block is ``model.cuda_graph``),
``bridge_cudagraph`` is only the package name. Submodules are named by
:class:`~bridge_cudagraph.parallel.layout.Submodule` (``"language"``, ``"vision"``), the same strings as the keys of
the ``MultiModuleProcessGroupCollection``.

The public API is imported lazily, so ``import bridge_cudagraph`` (and the pure ``config``/``layout``/``plan``
modules) does not pull in torch or Megatron.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "CudaGraphConfig": "bridge_cudagraph.config",
    "LanguageGraphConfig": "bridge_cudagraph.config",
    "VisionGraphConfig": "bridge_cudagraph.config",
    "CudaGraphConfigError": "bridge_cudagraph.config",
    "Submodule": "bridge_cudagraph.parallel.layout",
    "ParallelLayout": "bridge_cudagraph.parallel.layout",
    "VisionLayout": "bridge_cudagraph.parallel.layout",
    "build_collections": "bridge_cudagraph.parallel.groups",
    "derive_vision_collection": "bridge_cudagraph.parallel.groups",
    "build_plan": "bridge_cudagraph.plan.build",
    "CudaGraphProviderMixin": "bridge_cudagraph.bridge.mixin",
    "CudaGraphGPTModelProvider": "bridge_cudagraph.bridge.providers",
    "CudaGraphQwen3VLModelProvider": "bridge_cudagraph.bridge.providers",
    "CudaGraphQwen3VLMoEModelProvider": "bridge_cudagraph.bridge.providers",
    "CudaGraphQwen35VLModelProvider": "bridge_cudagraph.bridge.providers",
    "CudaGraphQwen35VLMoEModelProvider": "bridge_cudagraph.bridge.providers",
    "with_cuda_graphs": "bridge_cudagraph.bridge.providers",
    "PackedLanguageGraphHelper": "bridge_cudagraph.capture.packed",
    "PaddedLanguageGraphHelper": "bridge_cudagraph.capture.padded",
    "VisionGraphHelper": "bridge_cudagraph.capture.vision",
    "CudaGraphCallback": "bridge_cudagraph.bridge.callback",
    "install_bridge_helper": "bridge_cudagraph.bridge.loop",
    "load_recipe": "bridge_cudagraph.recipe.load",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'bridge_cudagraph' has no attribute {name!r}")
