"""compat's probes read the installed stack (the one pinned in ``TESTED_STACK``) and say what it has."""

from __future__ import annotations

import inspect

from bridge_cudagraph.host import compat


def test_vision_helper_probe_matches_the_installed_signature():
    from megatron.core.transformer.cuda_graphs import VisionTECudaGraphHelper

    params = inspect.signature(VisionTECudaGraphHelper.__init__).parameters
    assert compat.vision_helper_accepts_pg_collection() == ("pg_collection" in params)
    assert compat.vision_helper_accepts_pg_collection()  # megatron-core 0.19.2 (TESTED_STACK) has it


def test_every_probe_has_a_caller():
    """A probe no code calls is dead: every public function of compat is used outside it."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    names = [n for n, f in vars(compat).items() if inspect.isfunction(f) and f.__module__ == compat.__name__]
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=root, capture_output=True, text=True, check=True)
    sources = [
        (root / f).read_text()
        for f in files.stdout.split()
        if f != "bridge_cudagraph/host/compat.py" and not f.startswith("tests/") and (root / f).exists()
    ]
    unused = [n for n in names if not any(n in text for text in sources)]
    assert not unused, f"compat probes without a caller: {unused}"


def test_gtp_remat_probe_matches_the_installed_collection():
    """The probe says whether megatron-core declares the GTP_remat fields, and Bridge's decentralized builder (the one
    the probe's patch completes) sets none of them: if a Bridge release starts to, the patch has nothing left to do."""
    import dataclasses

    from megatron.bridge.training import initialize
    from megatron.core.process_groups_config import ProcessGroupCollection

    declared = {f.name for f in dataclasses.fields(ProcessGroupCollection)}
    assert compat.collection_declares_gtp_remat_groups() == all(n in declared for n in compat.GTP_REMAT_ALIASES)
    assert compat.collection_declares_gtp_remat_groups()  # megatron-core 0.19.2 (TESTED_STACK)
    source = inspect.getsource(initialize._create_pg_collection)
    assert not [n for n in compat.GTP_REMAT_ALIASES if f"{n}=" in source], "Bridge now sets a GTP_remat group"
