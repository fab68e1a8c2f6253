"""Exactly one owner captures each submodule inside Megatron-Bridge's training loop.

Why this module exists
----------------------
Bridge's ``train()`` (``megatron/bridge/training/train.py``, Bridge 0.6.2) runs its own language-graph lifecycle
whenever the model config says ``cuda_graph_impl == "transformer_engine"``:

* it builds ``TECudaGraphHelper(model=..., config=..., seq_length=..., micro_batch_size=..., optimizers=[...])``,
  adding ``pg_collection=`` when ``"pg_collection" in inspect.signature(TECudaGraphHelper.__init__).parameters``
  (``train.py``); the name is looked up in the module's globals *at call time*;
* it captures when ``not helper.graphs_created()`` and ``step - start == cuda_graph_warmup_steps``, toggling the
  DDP forward pre-hooks around it and setting the manual hooks (``train.py``);
* with ``cuda_graph_warmup_steps == 0`` it asserts ``helper.graphs_created()`` after the first step and sets the
  manual hooks (``train.py``);
* after the loop, on the normal *and* the early-exit path, ``_delete_cuda_graphs`` calls
  ``helper.delete_cuda_graphs()`` when ``helper.graphs_created()`` (``train.py``).

A ``bridge_cudagraph`` provider must keep ``cuda_graph_impl = "transformer_engine"``: that one field is also what
routes the language layers to their TE graphs at replay (``module.py`` ``_should_call_te_cudagraph``) and what makes
Bridge seed the graph-safe RNG and capture on a side stream (``initialize.py``). But Bridge's helper is
megatron-core's, which replays Qwen3-VL's layers without mRoPE and knows nothing of vision budgets, eager fallback or
re-capture after resume. So the graphs are owned by :class:`bridge_cudagraph.bridge.callback.CudaGraphCallback` and
Bridge's own capture must do nothing.

:func:`install_bridge_helper` rebinds that one name (through
:func:`bridge_cudagraph.host.bridge_helper.rebind_bridge_helper`),
``megatron.bridge.training.train.TECudaGraphHelper``, to the class :func:`dispatching_class` makes, which

* keeps the real constructor's signature (``pg_collection`` included, so Bridge's probe still passes it);
* for a config that is one of our providers (:func:`bridge_cudagraph.bridge.providers.is_graph_provider`) returns a
  :class:`CallbackOwnedGraphs`, whose ``graphs_created()`` is always true: Bridge's capture block is skipped,
  its warmup-0 assert holds (even when our capture fell back to eager), its manual-hook calls are no-ops, and its
  ``_delete_cuda_graphs`` call is forwarded to the callback, which then frees its graphs before Bridge tears
  anything down, also on the ``sys.exit`` path where ``on_train_end`` never fires;
* for any other config returns megatron-core's real ``TECudaGraphHelper``, built with the same arguments:
  upstream behaviour is unchanged.

Bridge's vision helper (``train.py``) is never built for our providers: they refuse
``vision_cuda_graph_impl != "none"`` (:mod:`bridge_cudagraph.bridge.mixin`), and the callback owns vision graphs too.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from bridge_cudagraph.host import compat

logger = logging.getLogger("bridge_cudagraph")

#: The provider's attribute that holds (weakly) who frees its graphs when Bridge asks its helper to. The claim lives
#: on the provider, the object Bridge hands the helper, as the chunks it built do (``_built_chunks``): no registry.
_OWNER_ATTRIBUTE = "_bridge_cudagraph_owner"


class CallbackOwnedGraphs:
    """What Bridge's ``train()`` holds as its ``cuda_graph_helper`` for a ``bridge_cudagraph`` provider.

    Every answer keeps Bridge's own graph code inert and its asserts true; the real lifecycle lives in the
    callback (see the module docstring).
    """

    def __init__(self, config: Any) -> None:
        self.config = config
        self._owner_checked = False

    def graphs_created(self) -> bool:
        """Always true: "nothing for Bridge to capture", and the truth Bridge's warmup-0 assert needs.

        Bridge builds this before its callbacks' ``on_train_start`` and first asks this at the first step, after
        them: a provider that no callback claimed by then would silently capture nothing, which is said once.
        """
        if not self._owner_checked:
            self._owner_checked = True
            if owner_of(self.config) is None:
                logger.warning(
                    "bridge_cudagraph: model.cuda_graph.language.enabled=true but no CudaGraphCallback claimed the "
                    "model at on_train_start, so no graphs will be captured; pass callbacks=[CudaGraphCallback()] "
                    "to pretrain()/finetune() (bridge_cudagraph.bridge.train.run does)"
                )
        return True

    def create_cudagraphs(self) -> None:
        """Unreachable while :meth:`graphs_created` is true; a no-op for safety."""

    def cuda_graph_set_manual_hooks(self) -> None:
        """The callback sets manual hooks on the helpers that really captured."""

    def delete_cuda_graphs(self) -> None:
        """Bridge's end-of-loop teardown: forward it to the run's callback (idempotent there)."""
        owner = owner_of(self.config)
        if owner is not None:
            owner.release_graphs()


def install_bridge_helper() -> None:
    """Make Bridge's ``train()`` build :func:`dispatching_class`'s stand-in instead of megatron-core's helper
    (idempotent; undone by :func:`bridge_cudagraph.host.bridge_helper.uninstall_bridge_helper`). The ``train`` verb and
    the :class:`~bridge_cudagraph.bridge.callback.CudaGraphCallback` call it; so must a harness that runs Bridge's
    loop."""
    from bridge_cudagraph.host.bridge_helper import rebind_bridge_helper

    rebind_bridge_helper(dispatching_class)


def dispatching_class(real: type) -> type:
    """A stand-in for ``real`` (megatron-core's ``TECudaGraphHelper``) whose construction picks the owner."""
    signature = compat.init_signature(real)

    class TECudaGraphHelper(real):
        """Megatron-core's ``TECudaGraphHelper``, except for ``bridge_cudagraph`` providers, whose graphs the
        ``CudaGraphCallback`` owns (``bridge_cudagraph.bridge.loop``)."""

        def __new__(cls, *args, **kwargs):
            try:
                config = signature.bind(None, *args, **kwargs).arguments.get("config")
            except TypeError:  # let the real constructor report the bad call
                config = None
            from bridge_cudagraph.bridge.providers import is_graph_provider

            if is_graph_provider(config):
                return CallbackOwnedGraphs(config)
            # Not an instance of this class, so Python does not run __init__ again on it.
            return real(*args, **kwargs)

        def __init__(self, *args, **kwargs):  # pragma: no cover - __new__ never returns an instance of this class
            raise AssertionError("bridge_cudagraph.bridge.loop.TECudaGraphHelper is never instantiated")

    # Bridge decides whether to pass pg_collection from this signature: it must be the real one.
    TECudaGraphHelper.__init__.__signature__ = signature  # type: ignore[attr-defined]  # a function takes attributes
    TECudaGraphHelper.__module__ = __name__
    return TECudaGraphHelper


def claim(config: Any, owner: Any) -> None:
    """Make ``owner`` (with a ``release_graphs()`` method) the one Bridge's teardown reaches for ``config``."""
    object.__setattr__(config, _OWNER_ATTRIBUTE, weakref.ref(owner))


def unclaim(config: Any, owner: Any) -> None:
    """Undo :func:`claim` (only ``owner``'s own claim)."""
    if owner_of(config) is owner:
        object.__delattr__(config, _OWNER_ATTRIBUTE)


def owner_of(config: Any) -> Any | None:
    """The owner claimed for ``config`` and still alive, or ``None``."""
    ref = getattr(config, _OWNER_ATTRIBUTE, None)
    return ref() if ref is not None else None
