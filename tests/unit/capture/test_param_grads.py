"""capture.param_grads: what it relies on in the installed TE and in torch's autograd engine, and its gate."""

from __future__ import annotations

import types

import torch

from bridge_cudagraph.capture.param_grads import ddp_consumes_param_grads, sum_param_grads
from bridge_cudagraph.host import compat


def _nested_code(code: types.CodeType) -> dict[str, list[types.CodeType]]:
    """Every function nested in ``code``, by name (recursively)."""
    found: dict[str, list[types.CodeType]] = {}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found.setdefault(const.co_name, []).append(const)
            for name, codes in _nested_code(const).items():
                found.setdefault(name, []).extend(codes)
    return found


def test_the_installed_te_holds_the_state_where_the_probe_looks():
    """The probe follows closure names from the callable ``make_graphed_callables`` returns (what
    ``_make_graphed_callables`` built) to ``Graphed.backward`` (compat.TE_GRAPHED_CLOSURE); the installed TE's own code
    objects must close over exactly those names, or the probe would find nothing on the GPU and the product would
    quietly keep the per-parameter path."""
    from transformer_engine.pytorch import graph as te_graph

    graphed, graphed_cls, params, grads, slots = compat.TE_GRAPHED_CLOSURE
    nested = _nested_code(te_graph._make_graphed_callables.__code__)
    assert any(graphed in code.co_freevars for code in nested["new_fwd"])
    assert any({graphed_cls, params} <= set(code.co_freevars) for code in nested["functionalized"])
    assert any({grads, slots} <= set(code.co_freevars) for code in nested["backward"])


def test_a_callable_that_is_not_tes_has_no_state():
    assert compat.te_graphed_backward_state(lambda x: x) is None
    assert compat.te_graphed_backward_state(torch.nn.Linear(2, 2)) is None


class _Scale(torch.autograd.Function):
    """A stand-in for TE's ``Graphed``: one non-tensor argument, then the input and the parameter."""

    @staticmethod
    def forward(ctx, flag, x, weight):
        del flag
        ctx.save_for_backward(x, weight)
        return x * weight

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        return None, grad * weight, grad * x


def test_a_post_hook_that_hands_none_for_a_parameter_still_runs_its_accumulator_hook():
    """What SummedGraph relies on: a node post-hook may replace its gradients (here: None for the parameter), the
    parameter's ``AccumulateGrad`` then sets no ``.grad``, and a post-hook on that accumulator (where megatron-core's
    DDP tells a bucket the gradient is ready) still runs. The hook's tuple holds the tensor inputs only."""
    weight = torch.nn.Parameter(torch.full((3,), 2.0))
    x = torch.ones(3, requires_grad=True)
    accumulator = weight.expand_as(weight).grad_fn.next_functions[0][0]
    ran = []
    accumulator.register_hook(lambda *unused: ran.append(weight.grad))
    out = _Scale.apply(True, x, weight)
    seen = []

    def post(grad_inputs, grad_outputs):
        seen.append(len(grad_inputs))
        return (*grad_inputs[:-1], None)

    out.grad_fn.register_hook(post)
    out.sum().backward()
    assert seen == [2]
    assert ran == [None] and weight.grad is None
    assert torch.equal(x.grad, torch.full((3,), 2.0))


def test_the_gate_refuses_parameters_outside_megatron_ddp():
    """No DDP chunk owns the layer's parameters: nothing is changed (and nothing touches CUDA)."""
    layer = torch.nn.Linear(4, 4)
    sets = [types.SimpleNamespace(layers=[object()])]
    assert sum_param_grads(sets, [layer], [layer], fused=[]) == 0
    assert sum_param_grads([], [layer], [layer], fused=[]) == 0


def test_parameters_outside_megatron_ddp_are_not_summed_by_graphs():
    layer = torch.nn.Linear(4, 4)
    assert not ddp_consumes_param_grads([layer], [layer])


def test_frozen_parameters_need_no_owner_but_trainable_ones_do():
    frozen = torch.nn.Linear(4, 4).requires_grad_(False)
    # No chunk at all: every trainable parameter (none here) is owned.
    assert ddp_consumes_param_grads([], [frozen])
    assert not ddp_consumes_param_grads([], [torch.nn.Linear(4, 4)])
