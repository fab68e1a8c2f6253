"""One host object's class extended by a mixin in front, and the mixin taken off again; the host's classes are
untouched.

Host change:
  changes: the class of one host object (:func:`extend_instance_class`): a subclass that puts a mixin in front, for
    the language decoder (megatron-core's ``TransformerBlock`` or Bridge 0.6.2's ``Qwen3VLTransformerBlock``: the
    ladder's replay of :class:`~bridge_cudagraph.capture.block_replay.LadderReplayBlock`), the optimizer's objects
    (:mod:`bridge_cudagraph.host.optimizer`) and
    Bridge's ``Qwen3VLModel`` and its decoder (:mod:`bridge_cudagraph.host.forward`); the host's classes are untouched
  written for: megatron-core 0.19.2, Bridge 0.6.2, Transformer Engine 2.20
  gate: each caller's own (the plan, and the gates of its module)
  undo: :func:`restore_instance_class`, which takes one mixin off an object that carries two (the decoder's ladder
    replay and deepstack merge) in either order
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any

__all__ = ["HostABCMixin", "HostMixin", "extend_instance_class", "extend_instance_class_of", "restore_instance_class"]

if TYPE_CHECKING:
    # A mixin goes in front of a host class it does not name: the type checker sees its base as Any (its ``super()``
    # calls and the attributes it reads are the host's). At run time the base is the plain one.
    HostMixin = Any
    HostABCMixin = Any
else:
    HostMixin = object
    """The base of a mixin put in front of a host class (:func:`extend_instance_class`): ``object`` at run time."""
    HostABCMixin = abc.ABC
    """As :data:`HostMixin`, for a host class whose instance layout is added on top of ``abc.ABC``."""


_EXTENDED_CLASSES: dict[tuple[type, type], type] = {}


def extend_instance_class(obj: Any, mixin: type) -> None:
    """Give ``obj`` (one instance) a subclass of its own class with ``mixin`` in front, cached per class.

    For a host method with no hook, overridden for one object only: megatron-core 0.19.2's decoder
    (``TransformerBlock.forward``) for the packed replay, the optimizer's per-parameter walks for the host cache,
    Bridge 0.6.2's Qwen3-VL forward and deepstack merge (:mod:`bridge_cudagraph.host.forward`). The mixin must add no
    state the host saves or reads: parameters, buffers and state dicts are untouched (the optimizer cache keeps one
    private instance attribute, the forward a reference to its install's counts, dropped on uninstall).
    Undone by :func:`restore_instance_class`.
    """
    cls = type(obj)
    if issubclass(cls, mixin):
        return
    obj.__class__ = extend_instance_class_of(cls, mixin)


def extend_instance_class_of(cls: type, mixin: type) -> type:
    """The subclass of ``cls`` with ``mixin`` in front, made once per pair."""
    key = (cls, mixin)
    if key not in _EXTENDED_CLASSES:
        _EXTENDED_CLASSES[key] = type(
            f"{mixin.__name__}{cls.__name__}", (mixin, cls), {"__module__": mixin.__module__}
        )
    return _EXTENDED_CLASSES[key]


def restore_instance_class(obj: Any, mixin: type) -> None:
    """Take ``mixin`` off ``obj``'s class (:func:`extend_instance_class`), keeping any other mixin put on it: the
    packed replay's decoder mixin and :mod:`bridge_cudagraph.host.forward`'s deepstack one share an object, and
    their owners take them off in either order."""
    cls = type(obj)
    if not issubclass(cls, mixin):
        return
    layers: list[type] = []  # the mixins on obj, outermost first
    while cls in _EXTENDED_CLASSES.values():
        outer, cls = cls.__bases__
        layers.append(outer)
    for outer in reversed(layers):
        if outer is not mixin:
            cls = extend_instance_class_of(cls, outer)
    obj.__class__ = cls
