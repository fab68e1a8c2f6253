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


def _readme_tree() -> list[str]:
    """The paths the README's "Package" tree names: each line's first entry, under its top-level folder."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = re.search(r"^## Package\n.*?^```\n(.*?)^```", text, re.S | re.M)
    assert block, "README.md has no Package tree"
    paths, top = [], ""
    for line in block.group(1).splitlines():
        if not line.strip():
            continue
        entry = line.split()[0]
        if line.startswith(" "):
            paths.append(top + entry)
        else:
            top = entry if entry.endswith("/") else ""
            paths.append(entry)
    return paths


def test_every_path_in_the_readme_package_tree_exists():
    """The README's tree cannot go stale: each file it names is tracked, each folder holds tracked files."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout
    files = set(tracked.split())
    paths = _readme_tree()
    assert "bridge_cudagraph/vision_encoder.py" in paths and "benchmarks/bench.py" in paths
    missing = [p for p in paths if (not any(f.startswith(p) for f in files) if p.endswith("/") else p not in files)]
    assert not missing, f"README.md's Package tree names paths that are not in the repository: {missing}"


def test_the_shipped_package_holds_no_benchmark_or_harness_code():
    """pyproject ships bridge_cudagraph* only, and nothing under it is benchmark, leak-finder or harness code."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["bridge_cudagraph*"]
    assert not any("matplotlib" in d for d in project["project"]["dependencies"])
    tracked = subprocess.run(
        ["git", "ls-files", "bridge_cudagraph"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    assert not [f for f in tracked if "bench" in Path(f).name or "leak" in f or "/harness/" in f]
