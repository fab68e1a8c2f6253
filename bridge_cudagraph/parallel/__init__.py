"""Process groups as plain integers (:mod:`~bridge_cudagraph.parallel.layout`) and as real
``torch.distributed`` groups in megatron-core ``ProcessGroupCollection`` objects
(:mod:`~bridge_cudagraph.parallel.groups`)."""
