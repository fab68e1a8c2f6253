"""Glue to Megatron-Bridge: the providers and their ``cuda_graph`` block (:mod:`~bridge_cudagraph.bridge.providers`,
:mod:`~bridge_cudagraph.bridge.mixin`), the callback that runs the graphs' lifecycle in Bridge's loop, and
``train``."""
