"""Leaving a host change's block normally or by an exception: its undo must run either way."""

from __future__ import annotations

import pytest


class Boom(Exception):
    """Raised inside a changed block: the undo must still run."""


def leave(context, raising: bool) -> None:
    """Enter ``context`` and leave it, by :class:`Boom` when ``raising``."""
    if raising:
        with pytest.raises(Boom), context:
            raise Boom
    else:
        with context:
            pass
