"""``scripts/run.sh`` and ``scripts/test.sh``: after their set-up they say on stderr which python they run and where
the README's ``bridge-cudagraph`` command is (neither is on PATH after set-up), then run with that python. Each runs
here in a copy of the repository's scripts with a stand-in ``setup.sh`` and python (no environment is built)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.fast

#: A python that has no CUDA and echoes what it is asked to run.
_FAKE_PYTHON = """#!/usr/bin/env bash
if [ "$1" = "-c" ]; then exit 1; fi
echo "ran: $*"
"""


def _repo(tmp_path: Path, *, console_script: bool) -> tuple[Path, Path]:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("run.sh", "test.sh"):
        shutil.copy(ROOT / "scripts" / name, repo / "scripts" / name)
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    python = bin_dir / "python"
    python.write_text(_FAKE_PYTHON)
    python.chmod(0o755)
    if console_script:
        (bin_dir / "bridge-cudagraph").write_text("#!/usr/bin/env bash\n")
        (bin_dir / "bridge-cudagraph").chmod(0o755)
    (repo / "scripts" / "setup.sh").write_text(f"echo 'setup: nothing to do' >&2\necho {python}\n")
    return repo, python


@pytest.mark.parametrize("console_script", [True, False], ids=["venv", "container"])
@pytest.mark.parametrize("script", ["run.sh", "test.sh"])
def test_the_scripts_say_which_python_they_run(tmp_path, script, console_script):
    repo, python = _repo(tmp_path, console_script=console_script)
    done = subprocess.run(["bash", f"scripts/{script}", "x=1"], cwd=repo, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    err = done.stderr.splitlines()
    assert f"{script}: python {python}" in err
    if console_script:
        cli = python.parent / "bridge-cudagraph"
        assert f"{script}: bridge-cudagraph is {cli} (source {python.parent}/activate puts it on PATH)" in err
    else:
        assert f'{script}: bridge-cudagraph is "{python} -m bridge_cudagraph" here (from {repo})' in err
    expected = (
        "-m pytest -q x=1" if script == "test.sh" else "-m bridge_cudagraph plan recipes/tiny_qwen3_vl_photos.yaml x=1"
    )
    assert done.stdout == f"ran: {expected}\n"


def test_every_test_file_name_is_unique_across_the_test_paths():
    """The test folders have no ``__init__.py`` (pytest's default import mode), so two test files of one basename
    anywhere under the configured test paths stop the whole run at collection: the README's test command would
    then test nothing."""
    import tomllib
    from collections import Counter

    paths = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["testpaths"]
    names = Counter(p.name for path in paths for p in (ROOT / path).rglob("test_*.py"))
    assert not [name for name, count in names.items() if count > 1], names.most_common(3)
