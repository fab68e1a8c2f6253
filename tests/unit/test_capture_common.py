"""capture.common: when the graphs may hand back their parameter-gradient buffers without TE's clone."""

from __future__ import annotations

import torch

from bridge_cudagraph.capture.common import ddp_consumes_param_grads, param_grad_return_kwargs
from bridge_cudagraph.compat import te_graphs_can_alias_param_grads


def test_the_tested_te_can_skip_the_clone():
    # TE 2.20.2 (TESTED_STACK) has clone_param_grads_on_return; the probe reads the real signature.
    assert te_graphs_can_alias_param_grads()


def test_parameters_outside_megatron_ddp_keep_tes_clone():
    layer = torch.nn.Linear(4, 4)
    assert not ddp_consumes_param_grads([layer], [layer])
    assert param_grad_return_kwargs([layer], [layer]) == {}


def test_frozen_parameters_need_no_owner_but_trainable_ones_do():
    frozen = torch.nn.Linear(4, 4).requires_grad_(False)
    # No chunk at all: every trainable parameter (none here) is owned, so the clone can go.
    assert ddp_consumes_param_grads([], [frozen])
    assert not ddp_consumes_param_grads([], [torch.nn.Linear(4, 4)])
