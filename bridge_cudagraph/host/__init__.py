"""Every change this package makes to an object of megatron-core, Megatron-Bridge, Transformer Engine or their
dependencies, and every version probe (:mod:`~bridge_cudagraph.host.compat`).

Each module here opens with a ``Host change:`` block per change: what it changes, the release it was written for,
its gate and its undo (``tests/unit/test_package.py`` keeps the blocks complete). Every change is also gated by one
version check that runs before any model is built (:func:`~bridge_cudagraph.host.compat.check_proven_stack`:
``validate``, ``plan``, ``train`` and a provider's ``finalize()``), so no mirrored code runs unproven by surprise.

=========================  ================================================================================
module                     what it changes
=========================  ================================================================================
``changes``                nothing: the index of every change below, one line each with its release and undo
``bridge_helper``          Bridge's ``TECudaGraphHelper`` name: no second capture of the language layers
``training_loop``          Bridge's ``pretrain.train`` name: the graphs released when the loop raises
``dataset_helpers``        Bridge's ``compile_helpers`` name: the prebuilt dataset helpers where no Makefile ships
``offline_hub``            ``huggingface_hub``'s offline and cache constants and their environment variables
``from_hf_pretrained``     ``AutoBridge.from_hf_pretrained``: a hook ahead of each call
``bridge_recipes``         ``sys.modules["megatron.bridge.recipes"]``: its modules without its ``__init__``
``cpu_device_properties``  ``torch.cuda.get_device_properties`` on a machine without CUDA
``gtp_remat_aliases``      the GTP_remat fields of Bridge's decentralized process-group collection
``instance_class``         the class of one host object: a mixin in front, taken off again
``optimizer``              the optimizer objects' classes: their per-parameter walks done once
``finalize``               ``finalize_model_grads_func`` and megatron-core's ``reset_model_temporary_tensors`` name:
                           the module walk done once
``forward``                ``Qwen3VLModel`` and its decoder: the forward's host waits, put on and taken off
``rope_index``             ``Qwen3VLModel``: its mRoPE positions from one CPU copy (for ``forward``)
``row_merge``              ``Qwen3VLModel`` and its decoder: image-token and deepstack merges by rows (for ``forward``)
``flat_rows``              ``Qwen3VLModel``: the step's packed rows handed flat (for ``forward``)
``bound_grids``            ``Qwen3VLModel``: the collate's CPU grids bound to its grid arguments (for ``forward``)
``forward_counts``         ``Qwen3VLModel``'s instance dict: a reference to its install's counts (for ``forward``)
``step``                   ``optimizer``, ``finalize`` and ``forward``, put on and taken off together
``wgrad_fusion``           TE modules' ``fuse_wgrad_accumulation``, without APEX
``language_aliases``       ``Qwen3VLModel``'s second registration of its decoder: checkpoint keys as graphs off
``replica_sync``           ``finalize_model_grads_func``: the vision replicas' gradient average
``encoder_swap``           ``Qwen3VLModel.vision_model``, rebuilt under the encoder's own groups
``graph_grads``            TE's graphed callables' parameter-gradient clone flags, megatron-core's ready mark on
                           parameters: for gradients a ladder's graphs sum themselves
``finalize_chain``         nothing of its own: how ``finalize`` and ``replica_sync`` put a wrapper on and off
``data_workers``           the environment's ``TOKENIZERS_PARALLELISM`` while a data loader forks workers
``refusals``               nothing: reads the frame of a host configuration check that raised, to name its settings
=========================  ================================================================================

Outside this folder the package subclasses host classes at their documented seams and reads what those seams hand a
subclass; that is not a change of a host object, but it is host code an upgrade must re-read, so it is listed here:
:func:`~bridge_cudagraph.capture.capture_flag.megatron_capturing` and
:func:`~bridge_cudagraph.capture.failure.abandon_capture` (megatron-core's capture flag, ``_set_capture_start`` /
``_set_capture_end``, as its own helper raises it), :class:`~bridge_cudagraph.vision.encoder.GraphedQwen3VLVisionModel`
(Bridge's ``Qwen3VLVisionModel``), :class:`~bridge_cudagraph.bridge.loop.CallbackOwnedGraphs` (the helper class
Bridge's loop builds) and the providers (:mod:`bridge_cudagraph.bridge.providers`).
"""
