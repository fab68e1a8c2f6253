"""``bridge_cudagraph.host.bridge_helper``: Bridge's helper name is rebound by the plugin's loop and given back
as the very class it was."""

from __future__ import annotations

from bridge_cudagraph.bridge import loop as bridge_loop
from bridge_cudagraph.host import bridge_helper, compat
from bridge_cudagraph.host.changes import ORIGINAL


def test_bridge_helper_install_and_uninstall():
    train = compat.bridge_train_module()
    bridge_helper.uninstall_bridge_helper()
    real = train.TECudaGraphHelper
    bridge_loop.install_bridge_helper()
    try:
        assert train.TECudaGraphHelper is not real and issubclass(train.TECudaGraphHelper, real)
        assert getattr(train.TECudaGraphHelper, ORIGINAL) is real
        assert bridge_helper.bridge_helper_installed()
    finally:
        bridge_helper.uninstall_bridge_helper()
    assert train.TECudaGraphHelper is real and not bridge_helper.bridge_helper_installed()
    bridge_helper.uninstall_bridge_helper()  # a second uninstall changes nothing
    assert train.TECudaGraphHelper is real
