"""Benchmarks of bridge_cudagraph: not shipped with the package (the wheel holds ``bridge_cudagraph`` only).

Run from a checkout's root: ``python -m benchmarks.useful_tokens --out DIR`` (the variants in one process),
``python -m benchmarks.real_loop RECIPE --out DIR`` (the product's own loop). Modules: :mod:`~benchmarks.runner` (what
every variant goes through), :mod:`~benchmarks.useful_tokens` (the variants, data and command line),
:mod:`~benchmarks.report` (the JSON's arithmetic, ``.md`` and ``.png``), :mod:`~benchmarks.trace` (profiler traces).
How the numbers are made: ``benchmarks/README.md``. Tests: ``benchmarks/tests/``.
"""
