"""One wrapper in a model config's ``finalize_model_grads_func`` chain, put on and taken off: what
:mod:`~bridge_cudagraph.host.finalize` and :mod:`~bridge_cudagraph.host.replica_sync` both do to that function.

Host change:
  changes: nothing of its own: puts on and takes off the wrappers of :mod:`~bridge_cudagraph.host.finalize` and
    :mod:`~bridge_cudagraph.host.replica_sync`
  written for: as those two
  gate: as those two
  undo: :meth:`ChainLink.take_off`

Bridge's set-up sets the function, and more than one change wraps it. Each wrapper keeps the function it wrapped
under ``<tag>_wrapped`` and itself under ``<tag>_owner``. ``functools.wraps`` copies both onto any wrapper put on top
later, which is how a second install sees its own wrapper already in the chain; only the wrapper whose own
``_owner`` it is can be taken off, since taking one out from under another would drop that one too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ChainLink"]

ATTRIBUTE = "finalize_model_grads_func"


@dataclass(frozen=True)
class ChainLink:
    """The marks of one change's wrapper, named from ``tag``."""

    tag: str

    @property
    def wrapped(self) -> str:
        """Attribute set on the wrapper: the function it wrapped (copied onto wrappers put on top)."""
        return f"{self.tag}_wrapped"

    @property
    def owner(self) -> str:
        """Attribute set on the wrapper to itself (a copy on a wrapper on top names another function)."""
        return f"{self.tag}_owner"

    def in_chain(self, model_config: Any) -> bool:
        """Whether this change's wrapper is ``model_config``'s function, or under a wrapper put on top of it."""
        return getattr(getattr(model_config, ATTRIBUTE, None), self.wrapped, None) is not None

    def put_on(self, model_config: Any, wrapper: Callable[..., Any], wrapped: Callable[..., Any]) -> None:
        """Mark ``wrapper`` (made around ``wrapped``) and make it ``model_config``'s function."""
        setattr(wrapper, self.wrapped, wrapped)
        setattr(wrapper, self.owner, wrapper)
        setattr(model_config, ATTRIBUTE, wrapper)

    def take_off(self, model_config: Any, *, past_setattr: bool = False) -> bool:
        """Put back the function this change's wrapper wrapped; returns whether it did. Where another wrapper was
        put on top since, nothing changes. ``past_setattr``: assigned past any ``__setattr__`` of the config's
        class."""
        current = getattr(model_config, ATTRIBUTE, None)
        if current is None or getattr(current, self.owner, None) is not current:
            return False
        assign = object.__setattr__ if past_setattr else setattr
        assign(model_config, ATTRIBUTE, getattr(current, self.wrapped))
        return True
