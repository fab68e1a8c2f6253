"""``bridge_cudagraph.host.wgrad_fusion`` on the CPU: what can be checked without building TE modules (they need CUDA's
libraries here). The fusion itself, counted per module and bit for bit Bridge's model fusing the same modules, is
``tests/gpu/test_bridge_reference.py``."""

from __future__ import annotations

import types

import pytest
import torch

from bridge_cudagraph.host.wgrad_fusion import fuse_te_modules, te_modules_fusing, unfused_build

pytestmark = pytest.mark.fast


def test_modules_that_are_not_te_are_never_fused():
    """Only TE modules built from the given config take the fusion: a plain torch model has none, and counts none."""
    encoder = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    encoder.config = types.SimpleNamespace(gradient_accumulation_fusion=False)
    assert fuse_te_modules(encoder, encoder.config) == 0
    assert te_modules_fusing(encoder) == 0


def test_the_unfused_build_restores_the_recipes_value_when_the_build_raises(monkeypatch):
    """Where only TE can fuse (no APEX), the host builds with the setting off and gets the recipe's value back, also
    when its build raises: a refused build must not leave a changed config behind."""
    import bridge_cudagraph.host.compat as compat

    monkeypatch.setattr(compat, "apex_gradient_accumulation_fusion_available", lambda: False)
    provider = types.SimpleNamespace(gradient_accumulation_fusion=True)
    with pytest.raises(ValueError, match="boom"), unfused_build(provider) as te_only:
        assert te_only and provider.gradient_accumulation_fusion is False
        raise ValueError("boom")
    assert provider.gradient_accumulation_fusion is True
