"""Vision graph copies under a pipelined schedule: how many, and when a copy is free again (CPU, real autograd)."""

from __future__ import annotations

import pytest
import torch

from bridge_cudagraph.plan.budgets import in_flight_microbatches


@pytest.mark.parametrize(
    ("pp", "micro_batches", "expected"),
    [(1, 1, 1), (1, 8, 1), (2, 1, 1), (2, 4, 2), (4, 3, 3), (4, 16, 4)],
)
def test_in_flight_micro_batches_of_stage_zero(pp, micro_batches, expected):
    assert in_flight_microbatches(pp, micro_batches) == expected


@pytest.mark.parametrize(("pp", "micro_batches"), [(0, 1), (1, 0)])
def test_in_flight_refuses_nonsense(pp, micro_batches):
    with pytest.raises(ValueError, match="must be >= 1"):
        in_flight_microbatches(pp, micro_batches)


def _copies(count):
    from bridge_cudagraph.capture.vision import GraphCopies  # needs Bridge importable (as the CPU suite has)

    return GraphCopies(count)


def _forward(copies, weight):
    """A stand-in for one graphed vision forward: take a copy, produce an output that needs a gradient."""
    index = copies.acquire()
    if index is None:
        return None, None
    out = (weight * 2.0).sum()
    copies.release_after_backward(index, out)
    return index, out


def test_one_f_one_b_order_on_stage_zero_never_shares_a_copy():
    """pp 2, 4 micro-batches, stage 0: F0 F1 B0 F2 B1 F3 B2 B3 - two in flight, each with its own copy."""
    copies = _copies(2)
    weight = torch.ones(3, requires_grad=True)
    live = {}
    order = ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"]
    used = {}
    for event in order:
        kind, mb = event[0], int(event[1])
        if kind == "F":
            index, out = _forward(copies, weight)
            assert index is not None, f"{event}: no free copy"
            assert index not in {used[m] for m in live}, f"{event} took a copy micro-batch in flight still holds"
            used[mb], live[mb] = index, out
        else:
            live.pop(mb).backward()
    assert copies.in_flight() == 0
    assert sorted(set(used.values())) == [0, 1]


def test_a_third_in_flight_micro_batch_finds_no_copy():
    copies = _copies(2)
    weight = torch.ones(3, requires_grad=True)
    a = _forward(copies, weight)[1]
    _forward(copies, weight)
    assert _forward(copies, weight) == (None, None)
    a.backward()
    assert copies.in_flight() == 1
    assert _forward(copies, weight)[0] is not None


def test_without_gradient_the_copy_is_free_at_once():
    copies = _copies(1)
    weight = torch.ones(3, requires_grad=True)
    with torch.no_grad():
        assert _forward(copies, weight)[0] == 0
    assert copies.in_flight() == 0


def test_reset_frees_copies_an_aborted_step_left_taken():
    copies = _copies(2)
    weight = torch.ones(3, requires_grad=True)
    _forward(copies, weight)
    _forward(copies, weight)
    assert copies.in_flight() == 2
    copies.reset()
    assert copies.in_flight() == 0


def test_zero_copies_is_refused():
    from bridge_cudagraph.capture.checks import CaptureError

    with pytest.raises(CaptureError, match="copies must be >= 1"):
        _copies(0)
