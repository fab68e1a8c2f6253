"""What Transformer Engine's deterministic kernels ask of a graph's static attention shape.

Under ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0`` (megatron's determinism mode sets it; the exactness proofs run under it)
TE 2.20 picks attention backends for training with THD inputs (the vision graphs, the packed language graphs) by the
static shape a graph was captured with, not by the micro-batch's own: ``batch`` is the static ``cu_seqlens``' segment
count (every image slot and tail piece, zero-length ones too) and ``max_seqlen`` the static one
(``dot_product_attention/utils.py`` ``get_attention_backend``, the "Filter: Determinism" block):

* cuDNN's deterministic F16/BF16 THD backward asks for about ``128 x batch x heads x max_seqlen**2`` bytes of
  workspace on sm90 (TE's own note there, measured at two segments and power-of-two lengths), with ``batch`` and
  ``max_seqlen`` rounded up to powers of two and never less than 1 GiB: 59 static segments x 16 heads at
  ``max_seqlen`` 376 asked for exactly 32 GiB, ``128 x 64 x 16 x 512**2``, twice the unrounded product, and 2 x 16
  heads at 256 for 1 GiB, not 256 MiB (:func:`workspace_bytes`; ``tests/gpu/test_deterministic_workspace.py``
  measures it); tens of GiB at the shapes a vision ladder derives;
* from ``batch x heads x max_seqlen**2 >= 2**30`` on, TE drops the fused backend for the unfused one, which
  materialises the ``max_seqlen**2`` scores (what ran out of memory at the 2B shape: ``results/padded-gradients/``).

Eager Bridge passes each micro-batch's own segments and longest image, so its backend and workspace are those of the
data, while a graph's are those of its static shape. So under deterministic kernels the plan keeps a derived static
``max_seqlen`` below TE's unfused threshold (the fused backend, as eager's on real images) and its workspace within
:data:`DERIVED_WORKSPACE_LIMIT` (:func:`deterministic_max_seqlen`; a longer image runs eagerly, counted, as one above
any static limit does), refuses a set one at or above the threshold, and counts the workspace into the graphs' memory
estimate, which the run's memory check holds against the GPU.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping

__all__ = [
    "DERIVED_WORKSPACE_LIMIT",
    "DETERMINISTIC_ENV",
    "UNFUSED_FROM",
    "WORKSPACE_BYTES_PER_ELEMENT",
    "WORKSPACE_FLOOR",
    "deterministic_kernels",
    "deterministic_max_seqlen",
    "power_of_two_at_least",
    "why_lowered",
    "workspace_bytes",
]

#: TE's switch: ``"0"`` makes every attention module it builds deterministic.
DETERMINISTIC_ENV = "NVTE_ALLOW_NONDETERMINISTIC_ALGO"
#: Bytes of cuDNN's deterministic THD backward workspace per ``batch x heads x max_seqlen**2`` (TE 2.20, sm90).
WORKSPACE_BYTES_PER_ELEMENT = 128
#: The least workspace cuDNN's deterministic THD backward asks for, however small the shape (sm90, 16 heads).
WORKSPACE_FLOOR = 2**30
#: ``batch x heads x max_seqlen**2`` from which TE 2.20 drops fused attention for the unfused backend (sm90).
UNFUSED_FROM = 2**30
#: The workspace a *derived* static shape may ask for under deterministic kernels (a set one is only held below
#: :data:`UNFUSED_FROM`, its workspace counted into the memory estimate).
DERIVED_WORKSPACE_LIMIT = 16 * 2**30


def deterministic_kernels(environ: Mapping[str, str] | None = None) -> bool:
    """Whether TE builds its attention deterministic in this process (it reads the variable as ``int``)."""
    value = (os.environ if environ is None else environ).get(DETERMINISTIC_ENV, "1").strip()
    return value == "0"


def power_of_two_at_least(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for ``n <= 1``): how cuDNN sizes the workspace's batch and length."""
    return 1 << max(n - 1, 0).bit_length()


def workspace_bytes(segments: int, heads: int, max_seqlen: int) -> int:
    """cuDNN's deterministic THD backward workspace for a static attention shape (sm90): TE 2.20's estimate with the
    segment count and ``max_seqlen`` rounded up to powers of two, at least :data:`WORKSPACE_FLOOR`, as cuDNN asked
    for it."""
    rounded = power_of_two_at_least(segments) * heads * power_of_two_at_least(max_seqlen) ** 2
    return max(WORKSPACE_FLOOR, WORKSPACE_BYTES_PER_ELEMENT * rounded)


def _largest_length_within(workspace: int, segments: int, heads: int) -> int:
    """The largest ``max_seqlen`` whose workspace at ``segments x heads`` is at most ``workspace`` bytes: the largest
    power of two ``p`` with ``workspace_bytes(segments, heads, p) <= workspace`` (0 where not even 1 fits)."""
    if workspace < WORKSPACE_FLOOR:
        return 0
    elements = workspace // (WORKSPACE_BYTES_PER_ELEMENT * power_of_two_at_least(segments) * heads)
    root = math.isqrt(elements)
    return 1 << (root.bit_length() - 1) if root else 0


def deterministic_max_seqlen(
    longest: int, heads: int, segments_at: Callable[[int], int], *, multiple: int = 1, workspace: int | None = None
) -> int:
    """The largest static ``max_seqlen`` up to ``longest`` (a multiple of ``multiple``) that keeps TE's fused
    deterministic backend, ``segments x heads x max_seqlen**2 < UNFUSED_FROM``, and, where ``workspace`` is given,
    whose workspace (:func:`workspace_bytes`) is at most that; with the segment count it implies
    (``segments_at(max_seqlen)``: tail pieces grow as ``max_seqlen`` shrinks). ``longest`` itself where it holds;
    0 where not even ``multiple`` does."""
    seqlen = longest
    while seqlen >= multiple:
        segments = segments_at(seqlen)
        below = seqlen - multiple
        if segments * heads * seqlen**2 >= UNFUSED_FROM:
            below = min(below, math.isqrt((UNFUSED_FROM - 1) // (segments * heads)))
        elif workspace is not None and workspace_bytes(segments, heads, seqlen) > workspace:
            below = min(below, _largest_length_within(workspace, segments, heads))
        else:
            return seqlen
        seqlen = below // multiple * multiple
    return 0


def why_lowered(segments: int, heads: int, max_seqlen: int) -> str:
    """Why a static attention shape of ``segments x heads x max_seqlen**2`` is lowered under deterministic kernels:
    TE's unfused backend at or above :data:`UNFUSED_FROM`, else cuDNN's workspace above
    :data:`DERIVED_WORKSPACE_LIMIT` (the text the plan and its refusals give)."""
    if segments * heads * max_seqlen**2 >= UNFUSED_FROM:
        return (
            f"under {DETERMINISTIC_ENV}=0, TE 2.20 gives {segments} static segments x {heads} heads x max_seqlen "
            f"{max_seqlen}**2 >= 2**30 the unfused attention (its scores in memory, another backend than eager's)"
        )
    need = workspace_bytes(segments, heads, max_seqlen) / 2**30
    return (
        f"under {DETERMINISTIC_ENV}=0, cuDNN's attention backward of {segments} static segments x {heads} heads at "
        f"max_seqlen {max_seqlen} asks about {need:.1f} GiB of workspace (TE 2.20; a derived shape keeps it within "
        f"{DERIVED_WORKSPACE_LIMIT / 2**30:g} GiB)"
    )
