"""Keep vision-encoder replicas identical across the language model's tensor-parallel ranks.

With vision TP smaller than language TP, every language TP group holds ``language_tp / vision_tp`` copies of each
vision shard. Two things make the copies drift, both measured on two H200s (language TP 2, vision TP 1): their
random initialisation differs (Megatron seeds its model-parallel RNG per tensor-parallel rank), and vision
attention backward on packed sequences is not bitwise deterministic, so their gradients differ slightly. A drifted
replica feeds each language shard different image embeddings: the model is no longer one model.

This module builds the *replica groups* (the language TP ranks holding the same vision shard), broadcasts the
encoder's weights inside them once at construction, and averages the encoder's gradients inside them after
Megatron's gradient finalisation of every step. Averaging identical gradients changes nothing; it only removes
kernel noise, so a deterministic run is unaffected.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

#: Attribute under which the replica group is kept on the vision ``ProcessGroupCollection`` (not a declared field).
REPLICA_ATTR = "vision_replica"


def replica_rank_sets(language_tp_groups: list[list[int]], vision_tp: int) -> list[list[int]]:
    """For every language TP group (ranks ascending), the sets of ranks holding the same vision shard.

    Vision TP groups are contiguous runs of ``vision_tp`` ranks inside a language TP group, so shard ``s`` lives on
    positions ``s, s + vision_tp, ...`` of it. A vision TP group as large as a language TP group or larger (spanning
    context-parallel ranks) has no replicas there: every rank is its own set. Pure; covers only the given ranks.
    """
    sets: list[list[int]] = []
    for group in language_tp_groups:
        if vision_tp % len(group) == 0:  # the vision TP group spans whole language TP groups: no replicas
            sets.extend([rank] for rank in group)
            continue
        if len(group) % vision_tp:
            raise ValueError(f"vision tp {vision_tp} does not divide language tp group {group}")
        sets.extend(list(group[shard::vision_tp]) for shard in range(vision_tp))
    return sets


def build_replica_group(vision_pgc, language_tp_groups: list[list[int]], vision_tp: int):
    """Create the replica groups (collective: every rank of the world calls it, in the same order) and attach this
    rank's group to ``vision_pgc`` (None off the vision stage). Returns this rank's group or None."""
    group, _ = dist.new_subgroups_by_enumeration(replica_rank_sets(language_tp_groups, vision_tp))
    if vision_pgc is not None:
        setattr(vision_pgc, REPLICA_ATTR, group)
    return group


def replica_group_of(vision_pgc):
    """This rank's replica group, or None when there is none or it holds one rank (nothing to keep in sync)."""
    group = getattr(vision_pgc, REPLICA_ATTR, None) if vision_pgc is not None else None
    if group is None or dist.get_world_size(group) == 1:
        return None
    return group


def staging_device(backend: str, device: torch.device) -> torch.device:
    """Where a tensor on ``device`` must be to take part in a collective of a group with ``backend``: NCCL groups
    take only CUDA tensors, and Megatron builds a model on the CPU (``use_cpu_initialization`` or Bridge's
    ``get_model`` before it moves the chunks), so a CPU tensor is staged on the current CUDA device there."""
    if device.type == "cpu" and "gloo" not in backend.lower():
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _coalesced_in_place(tensors: list[torch.Tensor], group, collective) -> None:
    """Run ``collective(flat)`` once per dtype and device on ``tensors`` flattened (staged where the group's
    backend needs them, :func:`staging_device`), then copy the result back into each tensor in place."""
    backend = str(dist.get_backend(group))
    buckets: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for tensor in tensors:
        buckets.setdefault((tensor.dtype, tensor.device), []).append(tensor)
    for (_, device), bucket in buckets.items():
        flat = torch._utils._flatten_dense_tensors(bucket).to(staging_device(backend, device))
        collective(flat)
        for tensor, synced in zip(bucket, torch._utils._unflatten_dense_tensors(flat, bucket), strict=True):
            tensor.copy_(synced)


def broadcast_replicas(module: torch.nn.Module, group) -> None:
    """Give every replica the weights and buffers of the group's first rank, in one broadcast per dtype."""
    if group is None:
        return
    src = dist.get_global_rank(group, 0)
    with torch.no_grad():
        tensors = [t.data for t in [*module.parameters(), *module.buffers()]]
        _coalesced_in_place(tensors, group, lambda flat: dist.broadcast(flat, src=src, group=group))


def average_replica_grads(module: torch.nn.Module, group) -> None:
    """Average the encoder's gradients (``main_grad`` under Megatron DDP, else ``grad``) over the replica group,
    in one coalesced all-reduce per dtype."""
    if group is None:
        return
    grads = []
    for p in module.parameters():
        g = getattr(p, "main_grad", None)
        if g is None:
            g = p.grad
        if p.requires_grad and g is not None:
            grads.append(g)
    size = dist.get_world_size(group)

    def mean(flat: torch.Tensor) -> None:
        dist.all_reduce(flat, group=group)
        flat.div_(size)

    _coalesced_in_place(grads, group, mean)
