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
    names = [
        n
        for n, f in vars(compat).items()
        if inspect.isfunction(f) and f.__module__ == compat.__name__ and not n.startswith("_")
    ]
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


def test_the_installed_stack_is_proven():
    """The stack CI and the H200 run (TESTED_STACK's releases) passes the one version check."""
    compat.check_proven_stack(environ={})


def test_another_release_is_refused_in_one_line_that_names_the_way_out():
    import pytest

    from bridge_cudagraph.config import CudaGraphConfigError

    versions = {"megatron-core": "0.20.0", "megatron-bridge": "0.6.3", "transformer-engine": "2.20.0rc1"}
    with pytest.raises(CudaGraphConfigError) as refused:
        compat.check_proven_stack(versions, environ={})
    (line,) = str(refused.value).splitlines()
    assert line == (
        "megatron-core 0.20.0 is not a release bridge_cudagraph was proven on (megatron-core 0.19.x, megatron-bridge "
        "0.6.x, transformer-engine 2.20.x); install those, or set BRIDGE_CUDAGRAPH_UNPROVEN_STACK=1 to try anyway"
    )
    versions["transformer-engine"] = "2.21.0"
    with pytest.raises(CudaGraphConfigError, match=r"^megatron-core 0.20.0 and transformer-engine 2.21.0 are not "):
        compat.check_proven_stack(versions, environ={})
    compat.check_proven_stack(versions, environ={compat.UNPROVEN_STACK_ENV: "1"})  # the user's own risk
    with pytest.raises(CudaGraphConfigError):
        compat.check_proven_stack(versions, environ={compat.UNPROVEN_STACK_ENV: "yes"})  # only 1 says it


def test_validate_on_an_unproven_release_says_one_line_before_anything_is_built():
    """The CLI's ``validate`` of a bundled recipe, in a process whose megatron-core reports another release (the
    installed one cannot be swapped here): exit 2, one ``error:`` line naming the release and the way out, no
    traceback; with the environment variable set, the same command validates."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    code = (
        "import sys, megatron.core\n"
        "megatron.core.__version__ = '0.20.0'\n"
        "from bridge_cudagraph.cli import main\n"
        "sys.exit(main(['validate', 'recipes/tiny_qwen3_vl.yaml']))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != compat.UNPROVEN_STACK_ENV} | {"PYTHONWARNINGS": "ignore"}
    refused = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, env=env)
    assert refused.returncode == 2 and refused.stdout == "", (refused.returncode, refused.stdout, refused.stderr)
    assert "Traceback" not in refused.stderr, refused.stderr
    errors = [x for x in refused.stderr.splitlines() if x.startswith("error: ")]
    assert errors == [
        "error: megatron-core 0.20.0 is not a release bridge_cudagraph was proven on (megatron-core 0.19.x, "
        "megatron-bridge 0.6.x, transformer-engine 2.20.x); install those, or set BRIDGE_CUDAGRAPH_UNPROVEN_STACK=1 "
        "to try anyway"
    ], refused.stderr
    env[compat.UNPROVEN_STACK_ENV] = "1"
    tried = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, env=env)
    assert tried.returncode == 0 and tried.stdout.startswith("ok: recipes/tiny_qwen3_vl.yaml"), tried.stderr[-2000:]
