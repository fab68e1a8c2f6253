"""``bridge_cudagraph.host.dataset_helpers``: the prebuilt helpers replace Bridge's compilation where the install
needs it, once, and Bridge's own function comes back."""

from __future__ import annotations

from bridge_cudagraph.host import compat, dataset_helpers
from bridge_cudagraph.host.changes import ORIGINAL


def test_prebuilt_dataset_helpers_are_undone():
    from megatron.bridge.training import initialize

    dataset_helpers.restore_dataset_helpers()  # another test's train.run() may have left it in place
    original = initialize.compile_helpers
    applied = dataset_helpers.use_prebuilt_dataset_helpers()
    try:
        assert applied == compat.dataset_helpers_prebuilt_without_makefile()
        if applied:
            assert initialize.compile_helpers is not original
            assert getattr(initialize.compile_helpers, ORIGINAL) is original
            initialize.compile_helpers()  # the prebuilt module imports: no make, no sys.exit
            assert dataset_helpers.use_prebuilt_dataset_helpers()  # idempotent: wraps nothing twice
            assert getattr(initialize.compile_helpers, ORIGINAL) is original
        else:
            assert initialize.compile_helpers is original
    finally:
        dataset_helpers.restore_dataset_helpers()
    assert initialize.compile_helpers is original
