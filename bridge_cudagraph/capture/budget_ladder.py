"""The token-budget ladder: which of its rungs are captured, chosen from the sizes the data showed."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["BudgetLadder"]


class BudgetLadder:
    """Which rungs of a token-budget ladder are captured: chosen from the sizes the data showed, never a silent cap.

    Before the first capture every eager training micro-batch reports its size (:meth:`observe`; a shape, read on
    the host without waiting for the GPU). The first capture takes the rungs up to the one that holds the largest
    (:meth:`first_rungs`), every rung when nothing was seen (no warmup step, or no packed micro-batch). A micro-batch
    above the captured top runs eagerly, counted by its helper, and asks for its rung (:meth:`want`); before the next
    training step the lifecycle captures the rungs up to it (:meth:`pending`), or, where they do not fit in memory,
    refuses them once (:meth:`refuse`) and such micro-batches go on running eagerly, counted.

    A ladder's budgets are its *possible* rungs (``micro batch x seq_length`` at the top); why the captured ones
    follow the data instead: ``docs/design/budget-ladder.md``.
    """

    def __init__(self, budgets: Sequence[int]) -> None:
        self.budgets = tuple(sorted(int(b) for b in budgets))
        self.seen = 0
        self.captured: tuple[int, ...] = ()
        self.wanted = 0
        self.refused = 0

    def observe(self, size: int) -> None:
        """A micro-batch of ``size`` tokens (patches) ran before capture."""
        self.seen = max(self.seen, int(size))

    def first_rungs(self) -> tuple[int, ...]:
        """The rungs of the first capture: up to the smallest that holds the largest size seen, else all."""
        if not self.seen:
            return self.budgets
        top = next((b for b in self.budgets if b >= self.seen), self.budgets[-1])
        return tuple(b for b in self.budgets if b <= top)

    def source(self) -> str:
        """Why :meth:`first_rungs` chose its top, for the capture summary."""
        if not self.seen:
            return "the whole ladder (no micro-batch seen before capture)"
        return f"the largest micro-batch before capture ({self.seen})"

    @property
    def top(self) -> int:
        """The largest captured rung (0 before any capture)."""
        return self.captured[-1] if self.captured else 0

    def holds(self, budget: int) -> bool:
        """Whether ``budget`` is captured."""
        return budget in self.captured

    def want(self, budget: int) -> None:
        """A micro-batch needed ``budget``, which is not captured (above the top)."""
        if budget > self.top and budget > self.refused:
            self.wanted = max(self.wanted, budget)

    def pending(self) -> tuple[int, ...]:
        """The rungs to capture before the next step: every rung above the top up to the largest wanted."""
        return tuple(b for b in self.budgets if self.top < b <= self.wanted)

    def add(self, rungs: Iterable[int]) -> None:
        """``rungs`` are captured now (a graphs mapping gives its budgets)."""
        self.captured = tuple(sorted(set(self.captured) | {int(b) for b in rungs}))
        if self.wanted <= self.top:
            self.wanted = 0

    def refuse(self) -> None:
        """The pending rungs cannot be captured (memory, or a failed capture): stop asking for them."""
        self.refused = max(self.refused, self.wanted)
        self.wanted = 0

    def reset(self) -> None:
        """Nothing captured (graphs deleted); what was seen stays."""
        self.captured = ()
        self.wanted = 0
        self.refused = 0
