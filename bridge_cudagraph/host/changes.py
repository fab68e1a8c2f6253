"""Every change this package makes to its host, one line each: the module of ``host/`` that makes it, what it changes,
the release it was written for and its undo. The list to re-read on an upgrade of megatron-core, Megatron-Bridge,
Transformer Engine or their dependencies; each module's own ``Host change`` block adds the gate, and its docstrings
the why.

The plugin changes no host source file. Where the host gives no hook, a module here rebinds one module-level name
for as long as it needs to, or puts a mixin in front of one object's class
(:mod:`~bridge_cudagraph.host.instance_class`). Each rebinding is made by its own module, and nowhere else
(``tests/unit/host/test_changes.py`` checks it). Each replacement carries the original under :data:`ORIGINAL`,
which is how its undo finds it, and every undo puts back the very object that was there before, or the absence of
one (the tests of each module check identity). The probes that decide whether a change applies to the installed
version are in :mod:`bridge_cudagraph.host.compat`, and every change is also gated by the proven stack
(:func:`~bridge_cudagraph.host.compat.check_proven_stack`). ``tests/unit/test_package.py`` checks that this list has
one line per block of every module.

Module-level names, rebound:

- ``bridge_helper``: ``megatron.bridge.training.train.TECudaGraphHelper``; Bridge 0.6.2; undo
  ``uninstall_bridge_helper``
- ``training_loop``: ``megatron.bridge.training.pretrain.train``; Bridge 0.6.2; undo: leaving the block
- ``dataset_helpers``: ``megatron.bridge.training.initialize.compile_helpers``; megatron-core 0.19.2 wheels under
  Bridge 0.6.2; undo ``restore_dataset_helpers``
- ``offline_hub``: ``huggingface_hub.constants.HF_HUB_OFFLINE`` / ``HF_HUB_CACHE`` and three environment variables;
  huggingface_hub (any); undo: leaving the block
- ``from_hf_pretrained``: ``AutoBridge.from_hf_pretrained``; Bridge 0.6.2; undo: leaving the block
- ``bridge_recipes``: ``sys.modules["megatron.bridge.recipes"]``, while the package is not imported; Bridge 0.6.2;
  undo: leaving the block
- ``cpu_device_properties``: ``torch.cuda.get_device_properties``, without CUDA; torch (any); undo: leaving the block
- ``finalize``: ``megatron.core.distributed.finalize_model_grads.reset_model_temporary_tensors``; megatron-core
  0.19.2; undo: leaving the block

Attributes and fields of host objects:

- ``finalize``: ``model_config.finalize_model_grads_func``, wrapped; megatron-core 0.19.2; undo ``uninstall``
- ``replica_sync``: ``model_config.finalize_model_grads_func``, wrapped; megatron-core 0.19.2, Bridge 0.6.2; undo
  ``uninstall_grad_sync``
- ``gtp_remat_aliases``: the GTP_remat fields of Bridge's decentralized ``ProcessGroupCollection``; Bridge 0.6.2,
  megatron-core 0.19.2; undo ``restore_bridge_collection``
- ``encoder_swap``: ``Qwen3VLModel.vision_model``, rebuilt inside the provider's ``provide()``; Bridge 0.6.2,
  megatron-core 0.19.2; undo: none needed
- ``language_aliases``: the ``decoder`` and ``rotary_pos_emb`` registrations on the ``Qwen3VLModel`` root, dropped
  inside the provider's ``provide()``; Bridge 0.6.2; undo: none needed
- ``wgrad_fusion``: ``fuse_wgrad_accumulation`` of the provider's TE modules; megatron-core 0.19.2, Bridge 0.6.2;
  undo: ``provide()`` returning
- ``graph_grads``: TE's parameter-gradient clone flags of one graphed callable; Transformer Engine 2.20; undo: the
  callable ``stop_cloning`` returns
- ``graph_grads``: megatron-core's ``_cudagraph_wgrad_ready_event`` on parameters; megatron-core 0.19.2; undo
  ``unmark_wgrad_ready``
- ``forward_counts``: one instance attribute of ``Qwen3VLModel``, a reference to its install's counts; Bridge 0.6.2;
  undo ``detach_counts``
- ``data_workers``: the environment's ``TOKENIZERS_PARALLELISM``; tokenizers 0.22 under Bridge 0.6.2; undo: leaving
  the block

Classes of host objects (a mixin in front of one object's class, the host's classes untouched):

- ``instance_class``: the class of one host object; megatron-core 0.19.2, Bridge 0.6.2, Transformer Engine 2.20;
  undo ``restore_instance_class``
- ``optimizer``: ``ChainedOptimizer``, its ``DistributedOptimizer`` members and their TE ``FusedAdam``; megatron-core
  0.19.2, Transformer Engine 2.20; undo ``uninstall``
- ``forward``: ``Qwen3VLModel`` and its decoder, the mixins and hooks below put on by the parts of
  ``model.cuda_graph.forward``; Bridge 0.6.2; undo ``uninstall``
- ``rope_index``: ``Qwen3VLModel`` (``CpuRopeIndex``), with a pre-hook on its input embedding; Bridge 0.6.2; undo
  ``forward.uninstall``
- ``row_merge``: ``Qwen3VLModel`` (``RowMerge``), with a hook on its encoder, and its decoder (``IndexedDeepstack``);
  Bridge 0.6.2; undo ``forward.uninstall``
- ``flat_rows``: ``Qwen3VLModel`` (``FlatPackedRows``); Bridge 0.6.2; undo ``forward.uninstall``
- ``bound_grids``: ``Qwen3VLModel`` (``BoundGrids``); Bridge 0.6.2; undo ``forward.uninstall``

Nothing of their own:

- ``step``: puts ``finalize``, ``optimizer`` and ``forward`` on and off together; as those three; undo ``uninstall``
- ``finalize_chain``: puts ``finalize``'s and ``replica_sync``'s wrappers on and off; as those two; undo
  ``ChainLink.take_off``
- ``refusals``: reads the frame of a host configuration check that raised; megatron-core 0.19.2, Bridge 0.6.2;
  nothing to undo
"""

from __future__ import annotations

__all__ = ["ORIGINAL"]

#: Set on every replacement a module of ``host/`` installs: the object it replaced (how each undo finds the original).
ORIGINAL = "_bridge_cudagraph_original"
