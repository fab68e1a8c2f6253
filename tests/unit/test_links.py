"""Every relative link of the project's Markdown lands: the file exists, and an anchor names one of its headings
(``recipes/README.md`` once pointed at a README heading that had been renamed; ``benchmarks/README.md`` linked
``results/...`` relative to the repository root, which GitHub resolves relative to the file)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _markdown_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=False)
    files = [ROOT / name for name in listed.stdout.split()] if listed.returncode == 0 else list(ROOT.rglob("*.md"))
    # A run's own reports (results/<claim>/runNN/) are records as the renderer wrote them, not edited afterwards.
    return sorted(
        p for p in files if ".venv" not in p.parts and p.is_file() and not re.match(r"run\d+$", p.parent.parent.name)
    )


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces as
    hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    headings = [line.lstrip("#").strip() for line in path.read_text().splitlines() if re.match(r"#{1,6} ", line)]
    return {slug(h) for h in headings}


def test_slugs_are_githubs():
    assert slug("Configuration reference") == "configuration-reference"
    assert slug("What each lever of the packed step gives") == "what-each-lever-of-the-packed-step-gives"
    assert slug("`model.cuda_graph`, in brief") == "modelcuda_graph-in-brief"


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_lands(path):
    broken = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading '{anchor}')")
    assert not broken, broken
