"""The benchmark of bridge_cudagraph: eager vs upstream's graphs vs ours on one GPU, its multi-GPU runner, report,
trace analysis and leak finder. Not part of the installed package (``pyproject.toml`` ships only
``bridge_cudagraph``): run it from a checkout's root, ``python -m benchmarks.bench --out results/bench --quick``,
or on two GPUs with ``bash scripts/bench_two_gpus.sh``. Its tests are in ``benchmarks/tests/``.

Modules: :mod:`~benchmarks.configs` (what is measured), :mod:`~benchmarks.schema` (the names and statuses of
``bench.json``), :mod:`~benchmarks.bench` (the variants, instrumentation, paired phase and command line),
:mod:`~benchmarks.bench_gpus` (the matrix split over GPUs), :mod:`~benchmarks.bench_trace` (profiler traces),
:mod:`~benchmarks.bench_report` (``bench.json`` -> ``bench.md``/``bench.png``) and :mod:`~benchmarks.leaks`.
"""
