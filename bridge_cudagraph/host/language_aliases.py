"""The Qwen3-VL model Bridge builds for language graphs, its checkpoint keys made those of a graphs-off model.

Host change:
  changes: the ``decoder`` and ``rotary_pos_emb`` module registrations on the ``Qwen3VLModel`` root
    (:func:`drop_language_aliases`)
  written for: Bridge 0.6.2 ``Qwen3VLModel``
  gate: the proven stack (:func:`bridge_cudagraph.host.compat.check_proven_stack`); a provider of this package, in
    its ``provide()``
  undo: none needed: it happens inside ``provide()``, before anyone holds the model

With ``cuda_graph_impl="transformer_engine"`` (what a provider of this package sets when its language graphs are on)
Bridge registers ``language_model.decoder`` and ``language_model.rotary_pos_emb`` as children of the Qwen3-VL root as
well, so the state dict holds every decoder key twice (``decoder.*`` beside ``language_model.decoder.*``) and a
checkpoint differs from a graphs-off run's.
"""

from __future__ import annotations

__all__ = ["drop_language_aliases"]


def drop_language_aliases(model) -> None:
    """Drop the root's second registration of ``language_model.decoder`` and ``.rotary_pos_emb``.

    The root keeps its read-only ``decoder`` property (so ``get_attr_wrapped_model(chunk, "decoder")`` still finds the
    layers) and the plain ``position_embedding_type`` string; only the module registrations go. A no-op on a model
    without a language model or without the aliases."""
    modules = getattr(model, "_modules", {})
    language = getattr(model, "language_model", None)
    if language is None:
        return
    for name in ("decoder", "rotary_pos_emb"):
        if modules.get(name) is not None and modules[name] is getattr(language, name, None):
            del modules[name]
