"""Bridge providers with the ``cuda_graph`` block: the mixin composed in front of the host's classes.

``CudaGraphGPTModelProvider``, ``CudaGraphQwen3VLModelProvider`` and ``CudaGraphQwen3VLMoEModelProvider`` are
the named ones; :func:`with_cuda_graphs` turns any provider *instance* (e.g. what a Bridge recipe function or
``AutoBridge.to_megatron_provider`` returns: ``Qwen3ModelProvider``, ``LlamaModelProvider``...) into the
matching graph-enabled class, keeping every field.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

from megatron.bridge.models.gpt_provider import GPTModelProvider
from megatron.bridge.models.qwen_vl.qwen3_vl_provider import Qwen3VLModelProvider, Qwen3VLMoEModelProvider

from bridge_cudagraph.bridge.mixin import CudaGraphProviderMixin, provider_fields


class _VisionProviderMixin:
    """Qwen3-VL specifics: a vision encoder exists."""

    def has_vision_encoder(self) -> bool:
        """Qwen3-VL builds a vision encoder on the first pipeline stage."""
        return True


@dataclass
class CudaGraphGPTModelProvider(CudaGraphProviderMixin, GPTModelProvider):
    """``GPTModelProvider`` with the ``cuda_graph`` block."""


@dataclass
class CudaGraphQwen3VLModelProvider(_VisionProviderMixin, CudaGraphProviderMixin, Qwen3VLModelProvider):
    """Dense Qwen3-VL provider with the ``cuda_graph`` block."""


@dataclass
class CudaGraphQwen3VLMoEModelProvider(_VisionProviderMixin, CudaGraphProviderMixin, Qwen3VLMoEModelProvider):
    """Qwen3-VL MoE provider with the ``cuda_graph`` block."""


_NAMED = {
    GPTModelProvider: CudaGraphGPTModelProvider,
    Qwen3VLModelProvider: CudaGraphQwen3VLModelProvider,
    Qwen3VLMoEModelProvider: CudaGraphQwen3VLMoEModelProvider,
}


@functools.cache
def cuda_graph_class_for(cls: type) -> type:
    """The graph-enabled subclass of a provider class (a named one, or one composed and cached here)."""
    if issubclass(cls, CudaGraphProviderMixin):
        return cls
    if cls in _NAMED:
        return _NAMED[cls]
    if not issubclass(cls, GPTModelProvider):
        raise TypeError(
            f"{cls.__name__} is not a GPTModelProvider; bridge_cudagraph supports GPT-family and Qwen3-VL providers"
        )
    bases: tuple[type, ...] = (CudaGraphProviderMixin, cls)
    if issubclass(cls, Qwen3VLModelProvider | Qwen3VLMoEModelProvider):
        bases = (_VisionProviderMixin, *bases)
    composed = type(
        f"CudaGraph{cls.__name__}", bases, {"__module__": __name__, "__doc__": f"{cls.__name__} + cuda_graph"}
    )
    return dataclass(composed)


def with_cuda_graphs(provider: Any, **cuda_graph: Any) -> Any:
    """A copy of ``provider`` as its graph-enabled class, every field kept; ``cuda_graph`` sets the block."""
    from bridge_cudagraph.config import cuda_graph_config_from_dict

    cls = cuda_graph_class_for(type(provider))
    fields = provider_fields(provider)
    if cuda_graph:
        fields["cuda_graph"] = cuda_graph_config_from_dict(cuda_graph, "model.cuda_graph")
    new = cls(**fields)
    for name in ("_pg_collection",):
        if hasattr(provider, name):
            object.__setattr__(new, name, getattr(provider, name))
    return new


def is_graph_provider(provider: Any) -> bool:
    """Whether ``provider`` carries the ``cuda_graph`` block."""
    return isinstance(provider, CudaGraphProviderMixin) and dataclasses.is_dataclass(provider)
