"""Subprocesses started at once and awaited one by one (for module-scoped fixtures of slow CLI runs)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def awaited(
    started: dict[str, subprocess.Popen], timeout: float = 600
) -> Iterator[Callable[[str], tuple[int, str, str]]]:
    """``result(name)`` waits for that process (once) and gives ``(returncode, stdout, stderr)``; on leaving, any
    process still running is killed."""
    results: dict[str, tuple[int, str, str]] = {}

    def result(name: str) -> tuple[int, str, str]:
        if name not in results:
            out, err = started[name].communicate(timeout=timeout)
            results[name] = (started[name].returncode, out, err)
        return results[name]

    try:
        yield result
    finally:
        for process in started.values():
            if process.poll() is None:
                process.kill()
