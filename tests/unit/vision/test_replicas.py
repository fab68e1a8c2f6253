"""Vision replicas across language tensor-parallel ranks: the replica sets (pure), and on a real 4-rank gloo world
(language tp 4, vision tp 1 and 2) the groups built with the collections, the initial broadcast and the gradient
averaging, which leaves every replica with the same weights and gradients."""

from __future__ import annotations

import pytest
from _dist import run_world

from bridge_cudagraph.vision.replicas import replica_rank_sets


@pytest.mark.parametrize(
    ("tp_groups", "vision_tp", "expected"),
    [
        ([[0, 1]], 1, [[0, 1]]),
        ([[0, 1], [2, 3]], 1, [[0, 1], [2, 3]]),
        ([[0, 1, 2, 3]], 2, [[0, 2], [1, 3]]),
        ([[0, 1, 2, 3]], 4, [[0], [1], [2], [3]]),
        ([[0], [1]], 2, [[0], [1]]),  # vision tp spanning two cp ranks of language tp 1
    ],
)
def test_replica_sets_hold_the_same_vision_shard(tp_groups, vision_tp, expected):
    assert replica_rank_sets(tp_groups, vision_tp) == expected


def test_vision_tp_must_divide_the_language_tp_group():
    with pytest.raises(ValueError, match="does not divide"):
        replica_rank_sets([[0, 1, 2, 3, 4, 5]], 4)


def _replica_world(rank: int, world: int, vision_tp: int) -> dict:
    import torch
    import torch.distributed as dist

    from bridge_cudagraph.parallel.groups import build_collections
    from bridge_cudagraph.parallel.layout import ParallelLayout, VisionLayout
    from bridge_cudagraph.vision.replicas import average_replica_grads, broadcast_replicas, replica_group_of

    collections = build_collections(ParallelLayout(tp=4), VisionLayout(tp=vision_tp), backend="gloo")
    group = replica_group_of(collections["vision"])
    members = sorted(dist.get_process_group_ranks(group)) if group is not None else [rank]

    torch.manual_seed(rank)  # replicas start different, as Megatron's per-tp-rank RNG makes them
    module = torch.nn.Linear(3, 2)
    module.register_buffer("scale", torch.full((2,), float(rank), dtype=torch.float64))  # a second dtype bucket
    broadcast_replicas(module, group)
    for p in module.parameters():
        p.main_grad = torch.full_like(p, float(rank))  # gradients that differ per rank, like kernel noise
    average_replica_grads(module, group)
    return {
        "members": members,
        "weight": module.weight.detach().clone(),
        "scale": module.scale.clone(),
        "grad": module.weight.main_grad.clone(),
    }


@pytest.mark.slow
@pytest.mark.parametrize("vision_tp", [1, 2])
def test_replicas_get_one_weight_and_the_average_gradient(vision_tp):
    results = run_world(4, _replica_world, vision_tp)
    expected_members = {1: [[0, 1, 2, 3]] * 4, 2: [[0, 2], [1, 3], [0, 2], [1, 3]]}[vision_tp]
    assert [r["members"] for r in results] == expected_members
    for r in results:
        peers = [results[m] for m in r["members"]]
        assert all(p["weight"].equal(r["weight"]) for p in peers)
        assert all(p["scale"].equal(r["scale"]) for p in peers)
        assert r["scale"].eq(min(r["members"])).all()  # the group's first rank's buffer
        mean = sum(r["members"]) / len(r["members"])
        assert r["grad"].eq(mean).all()
    if vision_tp == 2:  # the two shards' replica sets were broadcast from different sources
        assert not results[0]["weight"].equal(results[1]["weight"])


@pytest.mark.parametrize(
    ("backend", "device", "expected"),
    [("gloo", "cpu", "cpu"), ("cpu:gloo,cuda:nccl", "cpu", "cpu"), ("nccl", "cuda:1", "cuda:1")],
)
def test_staging_device_keeps_tensors_the_backend_takes(backend, device, expected):
    import torch

    from bridge_cudagraph.vision.replicas import staging_device

    assert staging_device(backend, torch.device(device)) == torch.device(expected)
