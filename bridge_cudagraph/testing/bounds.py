"""The parity bounds, torch-free so the benchmark's report (which must render without torch) reads the same numbers.

DESIGN.md's bound applies where kernels may differ: the max abs difference of the per-token loss and the worst
gradient's relative L2. Where the README says bit-exact, the tests assert exactness instead.
"""

from __future__ import annotations

#: Max abs per-token-loss difference where kernels may differ (DESIGN.md).
LOSS_BOUND = 1e-3
#: Worst parameter gradient's relative L2 difference where kernels may differ.
GRAD_BOUND = 1e-3
