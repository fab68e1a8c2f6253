"""Where a training step makes the host wait for the GPU, and who asked: :func:`census` records, under torch's sync
debug mode, each warning's site, the innermost frame outside torch with its callers."""

from __future__ import annotations

import collections
import functools
import os
import traceback
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

#: Frames of these standard-library files are not a site.
_STDLIB_PARTS = (f"{os.sep}contextlib.py", f"{os.sep}warnings.py")


@functools.cache
def torch_dir() -> str:
    """torch's package directory with a trailing separator: a frame under it is torch's own."""
    import torch

    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def is_own_frame(filename: str, torch_root: str) -> bool:
    """Whether a frame of ``filename`` is torch's or the standard library's plumbing rather than a site."""
    return os.path.abspath(filename).startswith(torch_root) or any(p in filename for p in _STDLIB_PARTS)


def frame_site(stack: Iterable[traceback.FrameSummary], *, depth: int = 3, skip: str = "host_syncs.py") -> str:
    """The innermost ``depth`` frames of ``stack`` (outermost first) outside torch, the standard library's plumbing
    and the file ending in ``skip``, innermost first, as ``path:line name <- ...`` (paths shortened)."""
    root = torch_dir()
    frames = [f for f in stack if not is_own_frame(f.filename, root) and not f.filename.endswith(skip)]
    chain = frames[-depth:]
    return " <- ".join(f"{_short(f.filename)}:{f.lineno} {f.name}" for f in reversed(chain)) or "(no Python frame)"


def _short(path: str) -> str:
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if marker in path:
            return path.split(marker, 1)[1]
    here = os.getcwd() + os.sep
    return path[len(here) :] if path.startswith(here) else path


def census(fn: Callable[[], Any]) -> dict[str, Any]:
    """``fn`` once under sync debug mode: ``{"total": n, "sites": [[site, count], ...]}``, most first."""
    import torch

    counts: collections.Counter[str] = collections.Counter()
    original = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            counts[frame_site(traceback.extract_stack()[:-1])] += 1
        else:
            original(message, category, filename, lineno, file, line)

    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
            torch.cuda.synchronize()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
            warnings.showwarning = original
    return {"total": sum(counts.values()), "sites": [[site, n] for site, n in counts.most_common()]}


def census_lines(variants: Mapping[str, Any], names: Iterable[str], top: int = 6) -> list[str]:
    """A markdown bullet per variant of ``names`` with a :func:`census`: its host waits and ``top`` sites."""
    lines = []
    for name in names:
        if not (syncs := (variants.get(name) or {}).get("host_syncs")):
            continue
        sites = "; ".join(f"{n} x `{site}`" for site, n in (syncs.get("sites") or [])[:top])
        most = f"; most from: {sites}" if sites else ""
        lines.append(f"- {name}: {syncs.get('total', 0)} host waits on the GPU in one step{most}.")
    return lines
