"""The provider mixin's wiring on a real gloo world: which collection each helper and the vision encoder get.

The models themselves need TE and a GPU (tests/gpu); the wiring does not: the vision collection is derived from the
collection Bridge hands ``provide_distributed_model`` (``_pg_collection``), never from ``parallel_state``, with the
block's own tensor-parallel size.
"""

from __future__ import annotations

import pytest
from _dist import run_world

from bridge_cudagraph.config import CudaGraphConfig, CudaGraphConfigError, LanguageGraphConfig, VisionGraphConfig
from bridge_cudagraph.examples import tiny


def _wiring(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from bridge_cudagraph.config import CudaGraphConfig, LanguageGraphConfig, VisionGraphConfig
    from bridge_cudagraph.examples import tiny
    from bridge_cudagraph.parallel.groups import build_collections
    from bridge_cudagraph.parallel.layout import ParallelLayout
    from bridge_cudagraph.testing.world import parallel_state_untouched

    language = build_collections(ParallelLayout(tp=2), None, backend="gloo")["language"]
    cfg = CudaGraphConfig(
        language=LanguageGraphConfig(enabled=True),
        vision=VisionGraphConfig(enabled=True, tensor_parallel_size=1),
        num_microbatches=3,
    )
    provider = tiny.tiny_qwen3_vl_provider(cfg, tensor_model_parallel_size=2)
    provider.finalize()
    provider._pg_collection = language  # what Bridge's provide_distributed_model sets
    vision = provider.vision_pg_collection()  # derived (collective) from the language collection
    again = provider.vision_pg_collection()
    return {
        "vision_tp": vision.tp.size(),
        "vision_dp": vision.dp.size(),
        "vision_is_not_language": vision is not language and vision.tp is not language.tp,
        "vision_tp_ranks": dist.get_process_group_ranks(vision.tp),
        "cached": again is vision,
        "untouched": parallel_state_untouched(),
    }


@pytest.mark.slow
def test_the_encoder_gets_a_collection_of_its_own():
    results = run_world(2, _wiring)
    for rank, r in enumerate(results):
        assert (r["vision_tp"], r["vision_dp"]) == (1, 2)
        assert r["vision_is_not_language"] and r["vision_tp_ranks"] == [rank]
        assert r["cached"] and r["untouched"]


def test_a_rank_given_no_vision_collection_does_not_derive_one():
    """PP 2: only stage 0 holds the encoder and gets a vision collection; stage 1 is given None and must not start
    the derivation, a collective (``new_group``) stage 0 never joins: under NCCL that hung two H200s."""
    from bridge_cudagraph.config import CudaGraphConfig, VisionGraphConfig
    from bridge_cudagraph.examples import tiny

    provider = tiny.tiny_qwen3_vl_provider(CudaGraphConfig(vision=VisionGraphConfig(enabled=True)))
    provider.set_vision_pg_collection(None)
    # No language collection was handed over, so deriving would raise; a given None is returned as it is.
    assert provider.vision_pg_collection() is None
    given = object()
    provider.set_vision_pg_collection(given)
    assert provider.vision_pg_collection() is given


def test_without_a_given_collection_the_derivation_needs_the_language_one():
    from bridge_cudagraph.config import CudaGraphConfig, VisionGraphConfig
    from bridge_cudagraph.examples import tiny

    provider = tiny.tiny_qwen3_vl_provider(CudaGraphConfig(vision=VisionGraphConfig(enabled=True)))
    with pytest.raises(RuntimeError, match="provide_distributed_model"):
        provider.vision_pg_collection()


def test_finalizing_twice_changes_nothing_and_plans_the_same():
    """Bridge finalizes the config ``train`` planned (on a copy) once more inside ``pretrain()``: the mixin's part is
    idempotent, and the plan of a twice-finalized provider is the plan of a once-finalized one."""
    from bridge_cudagraph.plan.build import build_plan
    from bridge_cudagraph.plan.facts import model_facts

    cfg = CudaGraphConfig(
        language=LanguageGraphConfig(enabled=True, warmup_steps=2), vision=VisionGraphConfig(enabled=True)
    )
    provider = tiny.tiny_qwen3_vl_provider(cfg)
    provider.apply_cuda_graph_settings()
    once = {f: getattr(provider, f) for f in ("cuda_graph_impl", "cuda_graph_warmup_steps", "use_te_rng_tracker")}
    plan_once = build_plan(model_facts(provider), cfg, world_size=1, micro_batch_size=2, global_batch_size=2)
    provider.apply_cuda_graph_settings()
    twice = {f: getattr(provider, f) for f in once}
    assert (
        once
        == twice
        == {"cuda_graph_impl": "transformer_engine", "cuda_graph_warmup_steps": 2, "use_te_rng_tracker": True}
    )
    assert build_plan(model_facts(provider), cfg, world_size=1, micro_batch_size=2, global_batch_size=2) == plan_once


def test_helpers_refuse_a_plan_of_another_configuration():
    from bridge_cudagraph.capture.from_plan import check_plan_matches
    from bridge_cudagraph.plan.build import build_plan
    from bridge_cudagraph.plan.facts import model_facts

    cfg = CudaGraphConfig(language=LanguageGraphConfig(enabled=True))
    provider = tiny.tiny_qwen3_vl_provider(cfg)
    plan = build_plan(model_facts(provider), cfg, world_size=1, micro_batch_size=2, global_batch_size=2)
    check_plan_matches(provider, plan)
    provider.seq_length = 2 * provider.seq_length
    with pytest.raises(CudaGraphConfigError, match="differs: seq_length"):
        provider.make_graph_helpers([], plan=plan)
