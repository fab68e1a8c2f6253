"""Tight packing: the packed language graphs run on each row's needed prefix, not on the row padded to the longest.

Bridge 0.6.2's Qwen3-VL step keeps tokens ``[B, L]`` (every row padded to the micro-batch's longest, rounded to 16)
and hands the decoder one THD segment of the full ``L`` per row. The padding at a row's end is computed for nothing:
attention is causal, so no earlier token reads it, and its loss mask is 0. Where the plan allows
(:attr:`~bridge_cudagraph.plan.capture_plan.PackedLanguagePlan.tight`), the packed replay
(:meth:`~bridge_cudagraph.capture.packed.PackedLanguageGraphHelper.replay`) keeps of each row only its first
``round_up(extent, 16)`` tokens (:class:`TightRows`), replays the graphs on those ``T'`` tokens at the smallest budget
that holds them, and puts the output back at the rows' positions of the ``[T, 1, H]`` layout Bridge's output layer and
loss expect, the dropped rows zeros.

A row's **extent** (:func:`bridge_cudagraph.micro_batch.row_extents`) is one past the last token that either
carries loss (``loss_mask``) or is an image or video token (the deepstack merge must find every visual row). Every
token the loss reads, and every token those attend to, is kept at its own position in its own row, with its own
rotary row: its arithmetic is unchanged. The dropped tokens have loss mask 0; their output (zeros) is multiplied by
it. The extents come from CPU copies the forward already makes (:mod:`bridge_cudagraph.host.rope_index`), so the
index tensors are built on the CPU and copied without a wait.

Gather and scatter are :class:`Reindex`: ``index_select`` forward and backward (a zero row appended where an index
names none), so neither direction uses atomics and both are deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["ROW_MULTIPLE", "Reindex", "TightRows", "gather_rows", "scatter_rows", "tight_rows"]

#: What each kept row is rounded up to: Bridge's Qwen3-VL step rounds rows to ``lcm(tp, 16)`` (``use_fp8_padding``),
#: and the packed path runs at tp-local width 16 multiples, so a kept row is never wider than the step's row.
ROW_MULTIPLE = 16


@dataclass(frozen=True, slots=True)
class TightRows:
    """The kept prefix of each of ``len(lengths)`` rows of ``width`` tokens, laid out one after another.

    Attributes:
        width: ``L``, the rows' padded width in the full ``[B x L]`` layout.
        lengths: Tokens kept per row (a multiple of :data:`ROW_MULTIPLE` or ``width``, at most ``width``).
    """

    width: int
    lengths: tuple[int, ...]

    @property
    def tokens(self) -> int:
        """``T'``: the tokens the graphs run on."""
        return sum(self.lengths)

    @property
    def full_tokens(self) -> int:
        """``T``: the tokens of the full layout."""
        return self.width * len(self.lengths)

    @property
    def cu_seqlens(self) -> list[int]:
        """The kept rows' boundaries ``[0, l0, l0 + l1, ...]`` (one THD segment per row)."""
        out = [0]
        for n in self.lengths:
            out.append(out[-1] + n)
        return out

    @property
    def max_seqlen(self) -> int:
        return max(self.lengths)

    def gather_index(self) -> torch.Tensor:
        """``[T']`` int64: the full-layout position of each kept token, in order."""
        return torch.cat([torch.arange(n) + r * self.width for r, n in enumerate(self.lengths)])

    def scatter_index(self) -> torch.Tensor:
        """``[T]`` int64: each full-layout position's kept position, ``T'`` (no row) where it was dropped."""
        out = torch.full((self.full_tokens,), self.tokens, dtype=torch.int64)
        out[self.gather_index()] = torch.arange(self.tokens)
        return out


def tight_rows(extents: Sequence[int], width: int, multiple: int = ROW_MULTIPLE) -> TightRows:
    """Each row's extent rounded up to ``multiple``, capped at ``width``."""
    if width < 1 or not extents or any(e < 1 or e > width for e in extents):
        raise ValueError(f"row extents {list(extents)} do not fit rows of {width} tokens")
    return TightRows(width, tuple(min(width, -(-int(e) // multiple) * multiple) for e in extents))


def _take(x: torch.Tensor, index: torch.Tensor, zero_row: bool) -> torch.Tensor:
    if zero_row:  # index == len(x) names a zero row
        x = torch.cat([x, x.new_zeros((1, *x.shape[1:]))])
    return x.index_select(0, index)


class Reindex(torch.autograd.Function):
    """``out[i] = x[index[i]]`` (``index == len(x)``: zeros), with backward ``grad_x[j] = grad[back[j]]``
    (``back[j] == len(grad)``: zeros): both an ``index_select``, so both deterministic. Correct when ``index`` and
    ``back`` are inverse maps of the kept rows (:meth:`TightRows.gather_index`, :meth:`TightRows.scatter_index`)."""

    @staticmethod
    def forward(ctx, x, index, back, zero_row_forward: bool, zero_row_backward: bool):
        ctx.save_for_backward(back)
        ctx.zero_row_backward = zero_row_backward
        return _take(x, index, zero_row_forward)

    @staticmethod
    def backward(ctx, grad):
        (back,) = ctx.saved_tensors
        return _take(grad.contiguous(), back, ctx.zero_row_backward), None, None, None, None


def gather_rows(x: torch.Tensor, gather: torch.Tensor, scatter: torch.Tensor) -> torch.Tensor:
    """The kept rows of ``x`` (``[T, ...]`` -> ``[T', ...]``)."""
    return Reindex.apply(x, gather, scatter, False, True)


def scatter_rows(x: torch.Tensor, gather: torch.Tensor, scatter: torch.Tensor) -> torch.Tensor:
    """``x`` (``[T', ...]``) back at its full-layout rows (``[T, ...]``), zeros elsewhere."""
    return Reindex.apply(x, scatter, gather, True, False)
