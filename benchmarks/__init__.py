"""Benchmarks of bridge_cudagraph, not shipped with the package: run from a checkout's root (``python -m
benchmarks.useful_tokens``, ``benchmarks.real_loop``, ``benchmarks.module_path``); how the numbers are made:
``benchmarks/README.md``."""
