"""What Transformer Engine's deterministic kernels ask of a graph's static attention shape.

Under ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0`` (megatron's determinism mode sets it; the exactness proofs run under it)
TE 2.20 runs THD attention for training (the vision graphs, the packed language graphs) on a backend and a workspace
chosen by the static shape a graph was captured with, not by the micro-batch's own. Two limits follow:

* TE drops the fused backend for the unfused one, which materialises the ``max_seqlen**2`` scores, from
  ``batch x heads x max_seqlen**2 >= 2**30`` on (``dot_product_attention/utils.py`` ``get_attention_backend``, the
  "Filter: Determinism" block), ``batch`` being the static ``cu_seqlens``' segment count, zero-length ones too
  (:data:`UNFUSED_FROM`, :func:`deterministic_max_seqlen`).
* cuDNN's deterministic F16/BF16 THD backward on sm90 sizes its workspace as if every segment held every token of the
  input: ``2 bytes x heads x batch x tokens**2``, with ``batch`` and ``tokens`` (the rows of q, a graph's budget)
  rounded up to powers of two and at least 32 and 1024, whatever ``max_seqlen`` says (:func:`workspace_bytes`). TE's
  own note there (``128 x batch x heads x max_seqlen**2``) holds only where the tokens are about eight times
  ``max_seqlen``, as in its sweep; ``tests/gpu/test_deterministic_workspace.py`` measures the law off that line.

Eager Bridge passes each micro-batch's own tokens and segments, so its backend and workspace are those of the data,
while a graph's are those of its static shape, the largest at the top budget. So under deterministic kernels the
plan keeps a static ``max_seqlen`` below TE's unfused threshold (the fused backend, as eager's on real data; a longer
image or row runs eagerly, counted), keeps a derived ladder's top budget within :data:`DERIVED_WORKSPACE_LIMIT`
(:func:`deterministic_budgets`; a larger micro-batch runs eagerly, counted, as one above any ladder does), refuses a
set ``max_seqlen`` at or above the threshold, and counts the workspace into the graphs' memory estimate, which the
run's memory check holds against the GPU.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence

__all__ = [
    "DERIVED_WORKSPACE_LIMIT",
    "DETERMINISTIC_ENV",
    "UNFUSED_FROM",
    "WORKSPACE_BYTES_PER_SCORE",
    "WORKSPACE_MIN_SEGMENTS",
    "WORKSPACE_MIN_TOKENS",
    "cut_derived_ladder",
    "deterministic_budgets",
    "deterministic_kernels",
    "deterministic_max_seqlen",
    "dropped_source",
    "power_of_two_at_least",
    "why_dropped",
    "why_lowered",
    "workspace_bytes",
]

#: TE's switch: ``"0"`` makes every attention module it builds deterministic.
DETERMINISTIC_ENV = "NVTE_ALLOW_NONDETERMINISTIC_ALGO"
#: Bytes per score of cuDNN's deterministic THD backward workspace (TE 2.20, sm90, bf16).
WORKSPACE_BYTES_PER_SCORE = 2
#: The fewest segments and tokens cuDNN sizes that workspace for, however small the shape.
WORKSPACE_MIN_SEGMENTS = 32
WORKSPACE_MIN_TOKENS = 1024
#: ``batch x heads x max_seqlen**2`` from which TE 2.20 drops fused attention for the unfused backend (sm90).
UNFUSED_FROM = 2**30
#: The workspace a *derived* ladder's top may ask for under deterministic kernels (a set ladder's is counted into the
#: memory estimate, not limited).
DERIVED_WORKSPACE_LIMIT = 16 * 2**30


def deterministic_kernels(environ: Mapping[str, str] | None = None) -> bool:
    """Whether TE builds its attention deterministic in this process (it reads the variable as ``int``)."""
    value = (os.environ if environ is None else environ).get(DETERMINISTIC_ENV, "1").strip()
    return value == "0"


def power_of_two_at_least(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for ``n <= 1``): how cuDNN sizes the workspace's batch and length."""
    return 1 << max(n - 1, 0).bit_length()


def workspace_bytes(segments: int, heads: int, tokens: int) -> int:
    """cuDNN's deterministic THD backward workspace for a static attention shape of ``tokens`` rows in ``segments``
    segments (sm90, TE 2.20): every segment sized for every token, both rounded up to powers of two and at least
    :data:`WORKSPACE_MIN_SEGMENTS` and :data:`WORKSPACE_MIN_TOKENS`; ``max_seqlen`` does not enter."""
    batch = max(power_of_two_at_least(segments), WORKSPACE_MIN_SEGMENTS)
    rows = max(power_of_two_at_least(tokens), WORKSPACE_MIN_TOKENS)
    return WORKSPACE_BYTES_PER_SCORE * heads * batch * rows**2


def deterministic_max_seqlen(longest: int, heads: int, segments_at: Callable[[int], int], *, multiple: int = 1) -> int:
    """The largest static ``max_seqlen`` up to ``longest`` (a multiple of ``multiple``) that keeps TE's fused
    deterministic backend, ``segments x heads x max_seqlen**2 < UNFUSED_FROM``, with the segment count it implies
    (``segments_at(max_seqlen)``: tail pieces grow as ``max_seqlen`` shrinks). ``longest`` itself where it holds;
    0 where not even ``multiple`` does."""
    seqlen = longest
    while seqlen >= multiple:
        segments = segments_at(seqlen)
        if segments * heads * seqlen**2 < UNFUSED_FROM:
            return seqlen
        below = min(seqlen - multiple, math.isqrt((UNFUSED_FROM - 1) // (segments * heads)))
        seqlen = below // multiple * multiple
    return 0


def deterministic_budgets(
    budgets: Sequence[int], heads: int, segments_at: Callable[[int], int], *, workspace: int
) -> tuple[int, ...]:
    """The rungs of ``budgets`` (ascending) from the bottom up to the largest whose workspace is at most
    ``workspace`` bytes, with the segment count a top implies (``segments_at(top)``: the tail's pieces shrink with
    it); empty where not even the smallest fits."""
    kept = list(budgets)
    while kept and workspace_bytes(segments_at(kept[-1]), heads, kept[-1]) > workspace:
        kept.pop()
    return tuple(kept)


def cut_derived_ladder(
    budgets: Sequence[int], heads: int, segments_at: Callable[[int], int]
) -> tuple[tuple[int, ...], str]:
    """A derived ladder under deterministic kernels: ``(kept, why)``, its rungs within
    :data:`DERIVED_WORKSPACE_LIMIT` (:func:`deterministic_budgets`) and, where any was dropped, the reason the plan
    gives (:func:`dropped_source`); every rung and ``""`` where all fit. ``kept`` may hold no rung the caller can use:
    the caller refuses then, naming its own settings."""
    kept = deterministic_budgets(budgets, heads, segments_at, workspace=DERIVED_WORKSPACE_LIMIT)
    if len(kept) == len(budgets):
        return tuple(budgets), ""
    return kept, why_dropped(segments_at(budgets[-1]), heads, budgets[-1])


def dropped_source(kept: Sequence[int], why: str) -> str:
    """Where a cut ladder's budgets come from (a plan's ``budgets_source``)."""
    return f"budgets above {kept[-1]} dropped for deterministic kernels: {why}; a larger micro-batch runs eagerly"


def why_lowered(segments: int, heads: int, max_seqlen: int) -> str:
    """Why a static ``max_seqlen`` is lowered under deterministic kernels: TE's unfused backend at or above
    :data:`UNFUSED_FROM` (the text the plan and its refusals give)."""
    return (
        f"under {DETERMINISTIC_ENV}=0, TE 2.20 gives {segments} static segments x {heads} heads x max_seqlen "
        f"{max_seqlen}**2 >= 2**30 the unfused attention (its scores in memory, another backend than eager's)"
    )


def why_dropped(segments: int, heads: int, tokens: int) -> str:
    """Why a derived ladder's rungs from ``tokens`` up are dropped under deterministic kernels: cuDNN's workspace
    there above :data:`DERIVED_WORKSPACE_LIMIT`."""
    need = workspace_bytes(segments, heads, tokens) / 2**30
    return (
        f"under {DETERMINISTIC_ENV}=0, cuDNN's attention backward of {tokens} tokens in {segments} static segments x "
        f"{heads} heads asks {need:g} GiB of workspace (TE 2.20, sm90; a derived ladder keeps it within "
        f"{DERIVED_WORKSPACE_LIMIT / 2**30:g} GiB)"
    )
