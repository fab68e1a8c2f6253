"""Every change this package makes to an object of megatron-core, Megatron-Bridge, Transformer Engine or their
dependencies, each module opening with a table (what it changes, the release it was written for, its gate, its
undo), and every version probe (:mod:`~bridge_cudagraph.host.compat`)."""
