"""Bridge's Qwen3.5-VL provider at a tiny shape, for the CPU plan tests (``tests/unit/plan/test_qwen35_vl.py``) and
the GPU test against Bridge's model (``tests/gpu/test_qwen35_vl_reference.py``): one shape, built once here."""

from __future__ import annotations

from megatron.bridge.models.qwen_vl.qwen35_vl_provider import Qwen35VLModelProvider, Qwen35VLMoEModelProvider
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5VisionConfig
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeVisionConfig

from bridge_cudagraph.examples.tiny_recipe import tiny_qwen3_vl_config


def tiny_qwen35(moe: bool = False, **overrides):
    """Bridge's Qwen3.5-VL provider at a tiny shape: 8 decoder layers (``linear_attention_freq`` 4, Bridge's default:
    three gated-delta-net layers, then one gated standard attention layer), a 2-layer vision encoder of Qwen3.5's HF
    class (no deepstack), the tiny Qwen3-VL recipe's token ids and vocabulary."""
    reference = tiny_qwen3_vl_config().model
    vision_class = Qwen3_5MoeVisionConfig if moe else Qwen3_5VisionConfig
    fields = dict(
        num_layers=8,
        hidden_size=512,
        ffn_hidden_size=1536,
        num_attention_heads=8,
        num_query_groups=2,
        kv_channels=64,
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        seq_length=reference.seq_length,
        language_max_sequence_length=reference.seq_length,
        vocab_size=reference.vocab_size,
        make_vocab_size_divisible_by=reference.make_vocab_size_divisible_by,
        vision_config=vision_class(depth=2, hidden_size=256, intermediate_size=512, num_heads=4, out_hidden_size=512),
        image_token_id=reference.image_token_id,
        video_token_id=reference.video_token_id,
        vision_start_token_id=reference.vision_start_token_id,
        vision_end_token_id=reference.vision_end_token_id,
        bos_token_id=1,
        eos_token_id=2,
        bf16=True,
        params_dtype=reference.params_dtype,
    )
    if moe:
        fields.update(num_moe_experts=4, moe_router_topk=2, moe_ffn_hidden_size=512, moe_grouped_gemm=False)
    fields.update(overrides)
    return (Qwen35VLMoEModelProvider if moe else Qwen35VLModelProvider)(**fields)
