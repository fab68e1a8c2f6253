"""The tiny providers the GPU tests and the tiny recipe build must construct and finalize on CPU."""

from __future__ import annotations

import pytest

from bridge_cudagraph.config import CudaGraphConfig, LanguageGraphConfig
from bridge_cudagraph.examples import tiny


@pytest.mark.parametrize(
    "make",
    [tiny.tiny_gpt_provider, tiny.tiny_qwen3_vl_provider, lambda cg=None: tiny.tiny_qwen3_vl_provider(cg, moe=True)],
    ids=["gpt", "qwen3_vl", "qwen3_vl_moe"],
)
def test_tiny_providers_finalize_with_and_without_graphs(make):
    off = make(None)
    off.finalize()
    assert off.cuda_graph_impl == "none"
    modules = ["attn"] if getattr(off, "num_moe_experts", None) else None
    on = make(CudaGraphConfig(language=LanguageGraphConfig(enabled=True, modules=modules)))
    on.finalize()
    assert on.cuda_graph_impl == "transformer_engine"
    assert on.use_te_rng_tracker


def test_upstream_provider_is_the_host_class_with_upstream_switch():
    plain = tiny.upstream_provider(tiny.tiny_qwen3_vl_provider())
    assert type(plain).__name__ == "Qwen3VLModelProvider"
    assert plain.cuda_graph_impl == "transformer_engine"
    plain.finalize()
