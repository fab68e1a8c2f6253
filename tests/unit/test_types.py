"""mypy over the files of pyproject's ``[tool.mypy]`` (the ``bridge_cudagraph`` package and ``benchmarks/``), as
``python -m mypy`` from the repository root: the bugs a type checker finds on the CPU (a dataclass built with fields
it does not have, a loop variable rebinding a float to a dict, an optional value used unchecked) fail here instead of
on a GPU call. Skipped where mypy is not installed (requirements-cpu.txt pins it)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_checked_files_type_check():
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed here (requirements-cpu.txt pins it; scripts/setup.sh installs it)")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"mypy exited {done.returncode}:\n{done.stdout}{done.stderr}"
    assert "Success: no issues found" in done.stdout, done.stdout + done.stderr
