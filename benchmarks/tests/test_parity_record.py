"""The parity record of a variant, on hand-made losses and gradients (CPU): every parameter's gradient compared with
its reference's, computed each time and held to the reference's own floor; a missing comparison or one beyond the
floor fails a graphed variant of ours; non-finite steps are named; a padded variant's loss tokens are compared with
the packed form's."""

from __future__ import annotations

import pytest
import torch

from benchmarks import useful_tokens
from bridge_cudagraph.testing.parity import diff

MASK = torch.tensor([[0.0, 1.0, 1.0, 1.0]])


def _grads(scale: float = 1.0, **override) -> dict:
    grads = {"w": torch.tensor([1.0, 2.0, 3.0]) * scale, "b": torch.tensor([0.5]) * scale}
    grads.update(override)
    return grads


def _reference(floor_scale: float) -> dict:
    """eager_packed's kept numbers: its fixed-batch loss and gradients, and its floor (its own second pass)."""
    loss, grads = torch.tensor([[9.0, 1.0, 2.0, 3.0]]), _grads()
    again = _grads(w=torch.tensor([1.0, 2.0, 3.0]) * floor_scale)
    floor = diff((loss.clone(), again), (loss, grads), worst=3, loss_mask=MASK)
    return {"fixed_loss": loss, "mask": MASK, "grad_norm": 4.0, "losses": [2.0, 1.5], "grads": grads, "floor": floor}


def _parity(variant: str, loss: torch.Tensor, grads: dict, reference: dict, losses=(2.0, 1.5)) -> dict:
    return useful_tokens.parity(variant, loss, MASK, 4.0, list(losses), reference, reference, grads=grads)


def test_every_parameter_is_compared_and_held_to_the_floor():
    reference = _reference(floor_scale=1.0 + 1e-3)  # the eager-vs-eager floor: 1e-3 relative on w
    loss = torch.tensor([[7.0, 1.0, 2.0, 3.0]])  # the first token carries no loss: it is not compared as masked
    within = _parity("ours_packed", loss, _grads(w=torch.tensor([1.0, 2.0, 3.0]) * (1 + 1.5e-3)), reference)
    fixed = within["fixed_batch"]
    assert fixed["masked"]["loss_max_abs"] == 0.0 and fixed["loss_max_abs"] == 2.0
    assert fixed["grads"]["grad_max_rel_l2"] == pytest.approx(1.5e-3, rel=1e-3)
    assert fixed["floor_grad_max_rel_l2"] == pytest.approx(1e-3, rel=1e-3) and fixed["within_floor"]
    useful_tokens.require_gradient_parity("ours_packed", within)
    beyond = _parity("ours_packed", loss, _grads(b=torch.tensor([0.6])), reference)  # b 20% off: 2x the floor is 2e-3
    assert not beyond["fixed_batch"]["within_floor"]
    with pytest.raises(useful_tokens.GradientParityError, match="beyond the eager floor"):
        useful_tokens.require_gradient_parity("ours_packed", beyond)
    useful_tokens.require_gradient_parity("upstream_padded", beyond)  # upstream's graphs are measured, not held


def test_a_missing_gradient_or_a_missing_comparison_is_never_exact():
    reference = _reference(floor_scale=1.0)  # an exact floor (deterministic kernels): the variant must be exact
    loss = reference["fixed_loss"].clone()
    exact = _parity("ours_padded", loss, _grads(), reference)
    assert exact["fixed_batch"]["within_floor"] and exact["fixed_batch"]["floor_exact"]
    missing = _parity("ours_padded", loss, {"w": _grads()["w"], "b": None}, reference)
    assert list(missing["fixed_batch"]["grads"]["grad_missing"]) == ["b (reference only)"]
    assert not missing["fixed_batch"]["within_floor"]
    no_grads = useful_tokens.parity("ours_packed", loss, MASK, 4.0, [2.0, 1.5], reference, reference)
    assert "grads" not in no_grads["fixed_batch"]
    with pytest.raises(useful_tokens.GradientParityError, match="no per-parameter gradient comparison"):
        useful_tokens.require_gradient_parity("ours_packed", no_grads)


def test_non_finite_steps_are_named_and_the_reference_compares_with_nothing():
    reference = _reference(floor_scale=1.0)
    loss = reference["fixed_loss"].clone()
    bad = _parity("ours_packed", loss, _grads(), reference, losses=(2.0, float("nan")))
    assert bad["nonfinite_steps"] == [1] and not bad["losses_finite"]
    assert bad["steps"]["identical"] is False
    own = useful_tokens.parity("eager_packed", loss, MASK, 4.0, [2.0, 1.5], None, None, grads=_grads())
    assert own["reference"] == "eager_packed" and "fixed_batch" not in own and own["losses_finite"]


def test_a_padded_variant_is_compared_with_the_packed_form_on_the_loss_tokens():
    # Two samples: padded rows of width 4; the packed form holds them at positions r x 4 + c.
    packed = {
        "fixed_loss": torch.tensor([[0.0, 1.0, 2.0, 0.0, 0.0, 3.0, 4.0, 5.0]]),
        "mask": torch.tensor([[0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0]]),
    }
    padded = torch.tensor([[9.0, 1.0, 2.0, 9.0, 9.0, 9.0], [9.0, 3.0, 4.0, 5.5, 9.0, 9.0]])
    got = useful_tokens.cross_form_diff(padded, packed)
    assert got.loss_max_abs == pytest.approx(0.5) and not got.loss_exact  # 5.5 against 5.0; padding ignored
