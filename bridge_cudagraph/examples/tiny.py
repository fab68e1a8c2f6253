"""Tiny GPT and Qwen3-VL (dense and MoE) models for parity tests, the tiny recipe and the benchmark.

Small enough to build in seconds on one GPU, with every feature the graphs must respect: RoPE (GPT), mRoPE
and deepstack (Qwen3-VL), a real Qwen3-VL vision encoder with 2-D RoPE and per-image attention, and MoE layers.
Dropout is 0, as in Qwen3-VL's own configs, so graphed and eager runs are comparable bit for bit.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from bridge_cudagraph.config import CudaGraphConfig

#: Token ids of the tiny vocabulary (Qwen3-VL's real ids are ~151k, far beyond a tiny embedding table).
TINY_VOCAB = 1024
IMAGE_TOKEN_ID = 1000
VIDEO_TOKEN_ID = 1001
VISION_START_TOKEN_ID = 1002
VISION_END_TOKEN_ID = 1003

_COMMON = dict(
    hidden_dropout=0.0,
    attention_dropout=0.0,
    bf16=True,
    params_dtype=torch.bfloat16,
    pipeline_dtype=torch.bfloat16,
    use_te_rng_tracker=True,
    make_vocab_size_divisible_by=128,
    vocab_size=TINY_VOCAB,
    share_embeddings_and_output_weights=False,
    # APEX's fused wgrad kernel is absent from plain PyPI/NGC-less installs; TE layers fuse on their own.
    gradient_accumulation_fusion=False,
    activation_func=torch.nn.functional.silu,  # SwiGLU, as Qwen3 and Llama
)


def tiny_gpt_provider(cuda_graph: CudaGraphConfig | None = None, **overrides: Any):
    """4 layers, hidden 512, RoPE, seq 256 (the shape measured in DESIGN.md)."""
    from bridge_cudagraph.bridge.providers import CudaGraphGPTModelProvider

    fields = dict(
        _COMMON,
        num_layers=4,
        hidden_size=512,
        ffn_hidden_size=2048,
        num_attention_heads=8,
        num_query_groups=4,
        seq_length=256,
        position_embedding_type="rope",
        normalization="RMSNorm",
        gated_linear_unit=True,
        add_bias_linear=False,
    )
    fields.update(overrides)
    return CudaGraphGPTModelProvider(cuda_graph=copy.deepcopy(cuda_graph) or CudaGraphConfig(), **fields)


def tiny_vision_config(out_hidden_size: int, **overrides: Any):
    """A 4-layer Qwen3-VL vision encoder (HF config), deepstack taps after its layers 1 and 2."""
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig

    fields: dict[str, Any] = dict(
        depth=4,
        hidden_size=256,
        intermediate_size=512,
        num_heads=4,
        in_channels=3,
        patch_size=16,
        spatial_merge_size=2,
        temporal_patch_size=2,
        out_hidden_size=out_hidden_size,
        num_position_embeddings=2304,
        deepstack_visual_indexes=[1, 2],
        hidden_act="gelu_pytorch_tanh",
    )
    fields.update(overrides)
    return Qwen3VLVisionConfig(**fields)


def tiny_qwen3_vl_provider(cuda_graph: CudaGraphConfig | None = None, *, moe: bool = False, **overrides: Any):
    """4 language layers (hidden 512, kv 64, mRoPE [12, 10, 10]) + the tiny vision encoder; ``moe`` swaps the
    dense MLPs for 4 experts, top-2."""
    from bridge_cudagraph.bridge.providers import CudaGraphQwen3VLModelProvider, CudaGraphQwen3VLMoEModelProvider

    hidden = overrides.pop("hidden_size", 512)
    fields = dict(
        _COMMON,
        num_layers=4,
        hidden_size=hidden,
        ffn_hidden_size=1536,
        num_attention_heads=8,
        num_query_groups=4,
        kv_channels=64,
        seq_length=256,
        language_max_sequence_length=256,
        mrope_section=[12, 10, 10],
        normalization="RMSNorm",
        gated_linear_unit=True,
        add_bias_linear=False,
        qk_layernorm=True,
        position_embedding_type="mrope",
        rotary_base=5000000.0,
        image_token_id=IMAGE_TOKEN_ID,
        video_token_id=VIDEO_TOKEN_ID,
        vision_start_token_id=VISION_START_TOKEN_ID,
        vision_end_token_id=VISION_END_TOKEN_ID,
        bos_token_id=1,
        eos_token_id=2,
        vision_config=tiny_vision_config(hidden),
        patch_size=16,
        temporal_patch_size=2,
        spatial_merge_size=2,
        deepstack_visual_indexes=[1, 2],
    )
    if moe:
        fields.update(
            num_moe_experts=4,
            moe_router_topk=2,
            moe_ffn_hidden_size=512,
            moe_grouped_gemm=False,
            moe_token_dispatcher_type="alltoall",
            moe_router_load_balancing_type="aux_loss",
            moe_aux_loss_coeff=1e-3,
            moe_router_dtype="fp32",
            # Bridge's MoE provider freezes both towers by default (qwen3_vl_provider.py); train everything here.
            freeze_language_model=False,
            freeze_vision_model=False,
        )
    fields.update(overrides)
    cls = CudaGraphQwen3VLMoEModelProvider if moe else CudaGraphQwen3VLModelProvider
    return cls(cuda_graph=copy.deepcopy(cuda_graph) or CudaGraphConfig(), **fields)


def ddp_config(**overrides: Any):
    """Megatron DDP settings of a Bridge fine-tune (fp32 grads, distributed optimizer)."""
    from megatron.core.distributed import DistributedDataParallelConfig

    fields = dict(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=False,
        overlap_param_gather=False,
        use_distributed_optimizer=True,
        check_for_nan_in_grad=False,
    )
    fields.update(overrides)
    return DistributedDataParallelConfig(**fields)


#: ``build``'s default: derive the vision collection from the language one (collectively, as under Bridge).
DERIVE = object()


def build(provider, pg_collection, *, vision_pg_collection=DERIVE, ddp=None) -> list[torch.nn.Module]:
    """``finalize()`` and ``provide_distributed_model`` exactly as Bridge's ``setup`` does, under ``pg_collection``
    (and, for Qwen3-VL, the vision encoder under ``vision_pg_collection``: derived from the language one by
    default; ``None`` on ranks outside the vision grid, e.g. later pipeline stages)."""
    import warnings

    setter = getattr(provider, "set_vision_pg_collection", None)
    if vision_pg_collection is not DERIVE and setter is not None:
        setter(vision_pg_collection)
    provider.finalize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return provider.provide_distributed_model(ddp_config=ddp or ddp_config(), pg_collection=pg_collection)


def copy_weights(src: list[torch.nn.Module], dst: list[torch.nn.Module]) -> None:
    """Make ``dst`` hold exactly ``src``'s weights (strict: the state-dict keys must be identical)."""
    for s, d in zip(src, dst, strict=True):
        d.load_state_dict(s.state_dict(), strict=True)


def upstream_provider(provider):
    """The same model as ``provider`` on the host's own class (no ``cuda_graph`` block), with upstream's
    language switch ``cuda_graph_impl="transformer_engine"``: what Bridge users run today."""
    from bridge_cudagraph.bridge.mixin import provider_fields

    host = next(c for c in type(provider).__mro__ if c.__module__.startswith("megatron.bridge"))
    fields = {k: v for k, v in provider_fields(provider).items() if k != "cuda_graph"}
    plain = host(**fields)
    plain.cuda_graph_impl = "transformer_engine"
    plain.use_te_rng_tracker = True
    return plain
