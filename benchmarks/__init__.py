"""Benchmarks of bridge_cudagraph, run from a checkout's root; how the numbers are made: ``benchmarks/README.md``."""
