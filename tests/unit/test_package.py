"""The package's public names resolve, and importing the package pulls in neither torch nor Megatron."""

from __future__ import annotations

import subprocess
import sys

import bridge_cudagraph


def test_every_export_resolves():
    for name in bridge_cudagraph.__all__:
        assert getattr(bridge_cudagraph, name) is not None, name


def test_import_is_light():
    code = "import sys, bridge_cudagraph; sys.exit(any(m in sys.modules for m in ('torch', 'megatron')))"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
