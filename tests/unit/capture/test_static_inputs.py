"""capture.static_inputs: the rungs of one copy share their static input buffers."""

from __future__ import annotations

import torch


def test_static_buffers_give_each_rung_a_view_of_one_buffer():
    """Rungs of one copy share their static inputs: views of the first rows of the largest rung's buffer, leaves
    that take a gradient of their own; a larger rung later gets a new buffer and the old views keep theirs."""
    from bridge_cudagraph.capture.static_inputs import StaticBuffers

    statics = StaticBuffers(device="cpu")
    top = statics.view("h", (8, 1, 4), torch.float32, requires_grad=True)
    small = statics.view("h", (4, 1, 4), torch.float32, requires_grad=True)
    assert small.data_ptr() == top.data_ptr() and small.is_leaf and small.requires_grad
    (small * 2).sum().backward()
    assert small.grad.shape == (4, 1, 4) and top.grad is None
    assert statics.nbytes() == 8 * 4 * 4
    larger = statics.view("h", (16, 1, 4), torch.float32)
    assert larger.data_ptr() != top.data_ptr() and top.shape == (8, 1, 4)
    statics.clear()
    assert statics.nbytes() == 0


def test_shapes_read_from_a_built_models_config_are_the_plans():
    """The rows per rank and the rotary width a capture reads off the model's own config equal what the plan derived
    from the provider (:class:`~bridge_cudagraph.plan.facts.ModelFacts`), with and without sequence parallelism and
    with ``kv_channels`` left to default to the head width."""
    from types import SimpleNamespace

    from bridge_cudagraph.capture.static_inputs import rotary_dim, sequence_split
    from bridge_cudagraph.examples import tiny
    from bridge_cudagraph.plan.facts import model_facts

    for fields in (
        {},
        {"tensor_model_parallel_size": 2, "sequence_parallel": True},
        {"tensor_model_parallel_size": 2, "sequence_parallel": False},
        {"kv_channels": None, "rotary_percent": 0.5},
    ):
        provider = tiny.tiny_qwen3_vl_provider(None, **fields)
        facts = model_facts(provider)
        config = SimpleNamespace(
            tensor_model_parallel_size=provider.tensor_model_parallel_size,
            sequence_parallel=provider.sequence_parallel,
            kv_channels=provider.kv_channels,
            hidden_size=provider.hidden_size,
            num_attention_heads=provider.num_attention_heads,
            rotary_percent=provider.rotary_percent,
        )
        assert sequence_split(config) == facts.sequence_split, fields
        assert rotary_dim(config) == facts.rotary_dim, fields
    assert sequence_split(SimpleNamespace(tensor_model_parallel_size=4, sequence_parallel=True)) == 4
