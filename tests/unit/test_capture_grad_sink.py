"""A graph's parameter gradients summed into ``main_grad`` once per replay (:mod:`bridge_cudagraph.capture.grad_sink`).

On the CPU the "graph" is a real differentiable module call with the signature TE's graphed callables have (tensor
arguments and keyword arguments, parameters taken from the module): what is tested is the autograd around it. The
input gradients and every ``main_grad`` equal what the per-parameter path (``AccumulateGrad`` and megatron-core's DDP
hook: ``main_grad.add_(grad)`` unless TE added it) gives, bit for bit; no parameter gets an ``AccumulateGrad`` call
(``param.grad`` stays None); a parameter TE already accumulated is skipped; readiness is registered once per parameter
that got a gradient. On the GPU the same path runs under every graphed parity test (``stats.param_grads_per_graph``).
"""

from __future__ import annotations

import torch

from bridge_cudagraph.capture.grad_sink import GradSink


class _Unit(torch.nn.Module):
    """Two layers and an unused parameter (TE leaves such a one out of its graph's inputs)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.unused = torch.nn.Parameter(torch.ones(3))

    def forward(self, hidden_states, rotary=None, *, scale=None, is_first_microbatch=None):
        out = self.norm(self.first(hidden_states))
        if rotary is not None:
            out = out * rotary
        return (out * scale,) if scale is not None else (out,)


def _with_main_grads(unit: torch.nn.Module) -> None:
    for p in unit.parameters():
        p.main_grad = torch.zeros_like(p, dtype=torch.float32)
        p.grad_added_to_main_grad = False


def _per_parameter(unit, x, rotary, scale, grad_out):
    """The path a graph's parameters take without the sink: AccumulateGrad, then DDP's hook adds to main_grad."""
    x = x.clone().requires_grad_(True)
    (out,) = unit(x, rotary, scale=scale)
    out.backward(grad_out)
    for p in unit.parameters():
        if p.grad is not None and not p.grad_added_to_main_grad:
            p.main_grad.add_(p.grad)
        p.grad = None
    return x.grad


class _Ready:
    """Records the readiness registrations (megatron-core's bucket group's method signature)."""

    def __init__(self) -> None:
        self.seen: list = []

    def register_grad_ready(self, param, force_all_reduce=False):
        self.seen.append((id(param), force_all_reduce))


def test_the_sink_sums_into_main_grad_as_the_hooks_do_with_no_accumulate_grad():
    reference, sunk = _Unit(), _Unit()
    sunk.load_state_dict(reference.state_dict())
    _with_main_grads(reference)
    _with_main_grads(sunk)
    ready = _Ready()
    owners = {p: (ready, True) for p in sunk.parameters()}
    sink = GradSink(sunk, list(sunk.parameters()), owners)

    x = torch.randn(4, 8)
    rotary = torch.randn(4, 8)
    grad_out = torch.randn(4, 8)
    for micro_batch in range(2):  # main_grad accumulates over micro-batches
        scale = torch.tensor(1.5 + micro_batch)
        ref_dx = _per_parameter(reference, x, rotary, scale, grad_out)
        h = x.clone().requires_grad_(True)
        (out,) = sink(h, rotary, scale=scale, is_first_microbatch=micro_batch == 0)
        assert isinstance(out, torch.Tensor) and out.grad_fn is not None
        out.backward(grad_out)
        assert torch.equal(h.grad, ref_dx)
        for (name, p), q in zip(sunk.named_parameters(), reference.parameters(), strict=True):
            assert p.grad is None, f"{name} went through AccumulateGrad"
            assert torch.equal(p.main_grad, q.main_grad), name
    assert torch.equal(sunk.first.weight.main_grad, reference.first.weight.main_grad)
    assert sunk.first.weight.main_grad.abs().sum() > 0 and not sunk.unused.main_grad.any()
    # Ready once per parameter with a gradient per backward; the unused one never (as without a graph node for it).
    used = [id(p) for n, p in sunk.named_parameters() if n != "unused"]
    assert ready.seen == [(i, True) for i in used] * 2


def test_a_gradient_te_already_added_is_not_added_again():
    unit = _Unit()
    _with_main_grads(unit)
    unit.first.weight.grad_added_to_main_grad = True  # TE's fused wgrad: the GEMM accumulated it
    sink = GradSink(unit, list(unit.parameters()), owners=None)
    (out,) = sink(torch.randn(4, 8, requires_grad=True))
    out.sum().backward()
    assert not unit.first.weight.main_grad.any() and unit.first.bias.main_grad.any()
    assert all(p.grad is None for p in unit.parameters())


def test_no_gradient_needed_is_a_plain_call():
    unit = _Unit()
    _with_main_grads(unit)
    sink = GradSink(unit, list(unit.parameters()), owners=None)
    x = torch.randn(4, 8)
    with torch.no_grad():
        (out,) = sink(x)
        (ref,) = unit(x)
    assert torch.equal(out, ref) and out.grad_fn is None
