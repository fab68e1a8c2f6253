"""Strict key checking for YAML blocks: an unknown key is an error that suggests the nearest valid name.

Megatron-Bridge's own loader logs ``Key 'x' ... not found ... Skipping`` and drops a misspelt key, so a typo
such as ``token_budget`` silently runs a different job. Ours refuses it before anything is applied.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Mapping
from typing import Any


class UnknownKeyError(KeyError):
    """A key that the target dataclass does not have; ``str()`` gives the readable message."""

    def __str__(self) -> str:
        return str(self.args[0])


def valid_keys(target: Any) -> list[str]:
    """Settable names of a dataclass (class or instance): its fields, public or not."""
    if dataclasses.is_dataclass(target):
        return [f.name for f in dataclasses.fields(target)]
    raise TypeError(f"{target!r} is not a dataclass")


def suggest(key: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest candidate, or an empty string."""
    close = difflib.get_close_matches(key, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


#: Past this many valid keys (a model provider has ~340) the message names the count instead of listing them.
MAX_LISTED_KEYS = 12


def unknown_key_message(key: str, allowed: Iterable[str], where: str) -> str:
    """``unknown setting where.key (did you mean 'x'?); valid keys of where: ...``, kept to one line."""
    allowed = list(allowed)
    path = f"{where}.{key}" if where else str(key)
    public = sorted(k for k in allowed if not k.startswith("_"))
    listed = ", ".join(public) if len(public) <= MAX_LISTED_KEYS else f"{len(public)} settings"
    return f"unknown setting {path}{suggest(str(key), allowed)}; valid keys of {where or 'the recipe'}: {listed}"


def check_keys(data: Mapping[str, Any], target: Any, where: str, extra: Iterable[str] = ()) -> None:
    """Raise :class:`UnknownKeyError` for the first key of ``data`` that ``target`` does not have."""
    allowed = [*valid_keys(target), *extra]
    for key in data:
        if key not in allowed:
            raise UnknownKeyError(unknown_key_message(str(key), allowed, where))
