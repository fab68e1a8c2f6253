"""The Qwen3-VL vision encoder Bridge builds, swapped for one built under the encoder's own process groups.

Host change:
  changes: ``model.vision_model`` of the ``Qwen3VLModel`` Bridge's provider just built under the language groups
  written for: Bridge 0.6.2 ``Qwen3VLModel`` (``vision_model``, ``freeze``), megatron-core 0.19.2 vision layer specs
  gate: the proven stack (:func:`bridge_cudagraph.host.compat.check_proven_stack`); a Qwen3-VL provider of this
    package, in its ``provide()``
  undo: none needed: it happens inside ``provide()``, before anyone holds the model, which is built this way

The encoder Bridge builds takes the language model's tensor-parallel group; the rebuilt one
(:class:`~bridge_cudagraph.vision.encoder.GraphedQwen3VLVisionModel`) takes ``vision_pg_collection`` and has the same
module tree, so its state-dict keys, and a checkpoint, are Bridge's.
"""

from __future__ import annotations

import copy

from bridge_cudagraph.vision.encoder import GraphedQwen3VLVisionModel, mark_vision_replicas, vision_spec

__all__ = ["rebuild_vision_encoder"]


def rebuild_vision_encoder(model, provider, vision_pg_collection) -> None:
    """Replace ``model.vision_model`` (built by Bridge with the language groups) with one built under
    ``vision_pg_collection``; a no-op on ranks without an encoder (later pipeline stages)."""
    old = getattr(model, "vision_model", None)
    if old is None:
        return
    if vision_pg_collection is None:
        raise RuntimeError("this rank holds the vision encoder but has no vision process-group collection")
    config = copy.deepcopy(old.config)
    config.tensor_model_parallel_size = vision_pg_collection.tp.size()
    config.sequence_parallel = False
    config.cuda_graph_impl = "none"
    from megatron.bridge.utils.cuda_graph import clear_cuda_graph_modules

    clear_cuda_graph_modules(config)
    layer_spec, merger_spec = vision_spec()
    new = GraphedQwen3VLVisionModel(
        config, layer_spec, merger_spec, pre_process=True, post_process=True, pg_collection=vision_pg_collection
    )
    new.to(device=next(old.parameters()).device)
    # What Bridge builds on the encoder later from its modules' config finds the encoder's groups there, as it finds
    # the language model's on the provider (``model_provider.py`` sets ``_pg_collection``): its PEFT adapters
    # (``peft/utils.py`` ``_get_pg_collection_from_module``), which otherwise fall back to parallel_state's globals,
    # the language TP group (or none at all under pure M4 groups). Set after construction, which deep-copies configs.
    config._pg_collection = vision_pg_collection
    model.vision_model = new
    del old
    model.freeze(
        freeze_language_model=False,
        freeze_vision_model=provider.freeze_vision_model,
        freeze_vision_projection=provider.freeze_vision_projection,
    )
    language_tp = model.pg_collection.tp
    mark_vision_replicas(new, language_tp_rank=language_tp.rank(), vision_tp=config.tensor_model_parallel_size)
    # Megatron seeds its model-parallel RNG per language TP rank, so the replicas were initialised differently:
    # give them the first replica's weights (a checkpoint load later overwrites all of them alike).
    from bridge_cudagraph.vision.replicas import broadcast_replicas, replica_group_of

    broadcast_replicas(new, replica_group_of(vision_pg_collection))
