"""The benchmark's progress lines (one function, shared by the in-process run and the multi-GPU parent)."""

from __future__ import annotations


def say(message: str) -> None:
    """A progress line on stdout, flushed (the device machine returns only the log's tail)."""
    print(f"[bench] {message}", flush=True)
