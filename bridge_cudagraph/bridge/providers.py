"""Bridge providers with the ``cuda_graph`` block: the mixin composed in front of the host's classes.

``CudaGraphGPTModelProvider``, ``CudaGraphQwen3VLModelProvider``, ``CudaGraphQwen3VLMoEModelProvider``,
``CudaGraphQwen35VLModelProvider`` and ``CudaGraphQwen35VLMoEModelProvider`` are the named ones;
:func:`with_cuda_graphs` turns any provider *instance* (e.g. what a Bridge recipe function or
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
from megatron.bridge.models.qwen_vl.qwen35_vl_provider import Qwen35VLModelProvider, Qwen35VLMoEModelProvider

from bridge_cudagraph.bridge.mixin import CudaGraphProviderMixin, provider_fields
from bridge_cudagraph.host import compat
from bridge_cudagraph.host.instance_class import HostMixin


class _VisionProviderMixin(HostMixin):
    """Qwen3-VL specifics: a vision encoder exists (Bridge's ``Qwen3VLModel``, which Qwen3.5-VL builds too)."""

    def has_vision_encoder(self) -> bool:
        """Qwen3-VL and Qwen3.5-VL build a vision encoder on the first pipeline stage."""
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


class _StageFromCollectionMixin(HostMixin):
    """Qwen3.5-VL specifics: its language block spec is built for this rank's pipeline stage, read off the collection
    Bridge passed, not off ``parallel_state``."""

    def build_language_spec(self, vp_stage=None, pp_rank=None):
        """Bridge's ``Qwen35VLModelProvider.build_language_spec`` with ``pp_rank`` filled in from the collection
        Bridge's ``provide_distributed_model(pg_collection=...)`` stored, where the caller gives none.

        Bridge's ``provide()`` (and ``build_mtp_spec``) call it without ``pp_rank``; megatron-core's
        ``get_transformer_block_with_experimental_attention_variant_spec`` then asks ``parallel_state`` for the rank
        (``get_transformer_layer_offset``, ``get_num_layers_to_build``), which raises under
        ``dist.use_decentralized_pg=true``, where ``parallel_state`` is never initialised: no Qwen3.5-VL model could be
        built there. Where ``parallel_state`` is initialised its pipeline group is the collection's, so the rank is
        the one it would read; with no collection stored the call is the host's, unchanged.
        """
        if pp_rank is None:
            pp = getattr(compat.provider_pg_collection(self), "pp", None)
            if pp is not None:
                pp_rank = pp.rank()
        return super().build_language_spec(vp_stage=vp_stage, pp_rank=pp_rank)


@dataclass
class CudaGraphQwen35VLModelProvider(
    _VisionProviderMixin, _StageFromCollectionMixin, CudaGraphProviderMixin, Qwen35VLModelProvider
):
    """Dense Qwen3.5-VL provider with the ``cuda_graph`` block.

    Bridge's ``Qwen35VLModelProvider`` is a ``GPTModelProvider`` (not a Qwen3-VL provider) whose ``provide()``
    builds Bridge's ``Qwen3VLModel``: the vision encoder is Bridge's ``Qwen3VLVisionModel`` without deepstack, the
    decoder mixes gated-delta-net and gated standard attention layers. Which graphs the plan can give it is
    :func:`bridge_cudagraph.plan.checks.check_linear_attention`'s decision.
    """


@dataclass
class CudaGraphQwen35VLMoEModelProvider(
    _VisionProviderMixin, _StageFromCollectionMixin, CudaGraphProviderMixin, Qwen35VLMoEModelProvider
):
    """Qwen3.5-VL MoE provider with the ``cuda_graph`` block (see :class:`CudaGraphQwen35VLModelProvider`)."""


_NAMED = {
    GPTModelProvider: CudaGraphGPTModelProvider,
    Qwen3VLModelProvider: CudaGraphQwen3VLModelProvider,
    Qwen3VLMoEModelProvider: CudaGraphQwen3VLMoEModelProvider,
    Qwen35VLModelProvider: CudaGraphQwen35VLModelProvider,
    Qwen35VLMoEModelProvider: CudaGraphQwen35VLMoEModelProvider,
}

#: The host provider classes that build Bridge's ``Qwen3VLModel`` (a vision encoder on the first stage).
_VISION_PROVIDERS = (Qwen3VLModelProvider, Qwen3VLMoEModelProvider, Qwen35VLModelProvider, Qwen35VLMoEModelProvider)
#: The host provider classes whose language spec is a per-layer block spec built for one pipeline stage.
_HYBRID_PROVIDERS = (Qwen35VLModelProvider, Qwen35VLMoEModelProvider)


@functools.cache
def cuda_graph_class_for(cls: type) -> type:
    """The graph-enabled subclass of a provider class (a named one, or one composed and cached here)."""
    if issubclass(cls, CudaGraphProviderMixin):
        return cls
    if cls in _NAMED:
        return _NAMED[cls]
    if not issubclass(cls, GPTModelProvider):
        raise TypeError(
            f"{cls.__name__} is not a GPTModelProvider; bridge_cudagraph supports GPT-family, Qwen3-VL and Qwen3.5-VL "
            "providers"
        )
    bases: tuple[type, ...] = (CudaGraphProviderMixin, cls)
    if issubclass(cls, _HYBRID_PROVIDERS):
        bases = (_StageFromCollectionMixin, *bases)
    if issubclass(cls, _VISION_PROVIDERS):
        bases = (_VisionProviderMixin, *bases)
    composed = type(
        f"CudaGraph{cls.__name__}", bases, {"__module__": __name__, "__doc__": f"{cls.__name__} + cuda_graph"}
    )
    return dataclass(composed)


def with_cuda_graphs(provider: Any, **cuda_graph: Any) -> Any:
    """A copy of ``provider`` as its graph-enabled class, every field kept; ``cuda_graph`` sets the block."""
    from bridge_cudagraph.config import cuda_graph_config_from_dict

    host_cls: type = type(provider)  # annotated: mypy takes type[Any] for unhashable (functools.cache)
    cls = cuda_graph_class_for(host_cls)
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
