"""The vision graphs' own reference: the same layers run eagerly on the very static inputs a rung's replay reads (same
budget, same padding), what a graph can promise to equal bit for bit (``test_vision_padding.py``,
``test_bridge_reference.py``)."""

from __future__ import annotations


def padded_eager_loss_and_grads(model, helper, budget: int, batch):
    """Loss and gradients of ``model`` on ``batch`` with the ``budget`` rung's graphs swapped for its layers run
    eagerly through the same replay path (the helper's static inputs, padding and ``max_seqlen``); the graphs are put
    back after. The swapped pass counts as a replay in the helper's stats."""
    from bridge_cudagraph.capture.vision import GraphSet, _PackedVisionLayer
    from bridge_cudagraph.testing.parity import loss_and_grads

    vision = model[0].module.module.vision_model
    replayed = helper.graphs[budget][0]
    max_seqlen = min(budget, helper.layout.max_seqlen)  # as the capture gives the rung
    layers = [_PackedVisionLayer(layer, max_seqlen) for layer in vision.decoder.layers]
    per_layer = tuple((i, i + 1) for i in range(len(layers)))
    helper.graphs[budget][0] = GraphSet(layers, replayed.rotary, replayed.cu_seqlens, per_layer)
    try:
        return loss_and_grads(model, batch)
    finally:
        helper.graphs[budget][0] = replayed
