"""Runs of decoder layers (``language.graph_unit: deepstack``) on a real megatron-core ``TransformerBlock`` (CPU).

A TE graph cannot replay without CUDA, so here each "graph" is the callable megatron-core's helper would capture,
run eagerly (the run's own ``forward``): what is tested is the routing the GPU tests rely on. The decoder's own loop,
through megatron-core's ``__call__``/``_te_cuda_graph_replay``, sends the head of a run to the run's callable, the
members pass the run's output through, the result and every gradient equal the eager block's, a member handed anything
else refuses, evaluation takes the host path, and the undo restores every layer. Bitwise equality with the
per-layer graphs on the GPU is ``tests/gpu/test_language_capture.py``'s and ``test_bridge_reference.py``'s.
"""

from __future__ import annotations

import pytest
import torch

from bridge_cudagraph.capture.runs import LayerRun, group_runs, heads_of

SEQ, MBS, HIDDEN = 16, 2, 64


def test_group_runs_covers_the_layers_once():
    layers = [torch.nn.Linear(2, 2) for _ in range(4)]
    runs = group_runs(layers, ((0, 1), (1, 2), (2, 4)))
    assert runs[0] is layers[0] and runs[1] is layers[1] and isinstance(runs[2], LayerRun)
    assert list(runs[2].layers) == layers[2:] and heads_of(runs) == [layers[0], layers[1], layers[2]]
    # The run holds the layers for capture but is no part of them: their parameters are the run's, none added.
    assert [id(p) for p in runs[2].parameters()] == [id(p) for layer in layers[2:] for p in layer.parameters()]
    with pytest.raises(ValueError, match="do not cover"):
        group_runs(layers, ((0, 2), (3, 4)))
    with pytest.raises(ValueError, match="at least two"):
        LayerRun(layers[:1])


def _cpu_block_world(rank: int, world_size: int) -> dict:
    """Everything runs in a 1-rank gloo world: megatron-core's layers need a process-group collection."""
    import contextlib

    from megatron.core import parallel_state
    from megatron.core.hyper_comm_grid import HyperCommGrid
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.transformer_block import TransformerBlock
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import TransformerLayer

    # The CPU shims of ../shared/wheels/README.md: the current device, the global buffer, a no-op RNG tracker.
    torch.cuda.current_device = lambda: torch.device("cpu")
    parallel_state._set_global_memory_buffer()

    class _NoRngTracker:
        def fork(self, name="model-parallel-rng"):
            return contextlib.nullcontext()

    mrandom._CUDA_RNG_STATE_TRACKER = _NoRngTracker()
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True

    grid = HyperCommGrid([1, 1, 1, 1], ["tp", "cp", "pp", "dp"])
    pgc = ProcessGroupCollection(
        tp=grid.create_pg("tp"),
        cp=grid.create_pg("cp"),
        pp=grid.create_pg("pp"),
        dp=grid.create_pg("dp"),
        dp_cp=grid.create_pg(["cp", "dp"]),
        tp_cp=grid.create_pg(["tp", "cp"]),
    )
    config = TransformerConfig(
        num_layers=4,
        hidden_size=HIDDEN,
        num_attention_heads=4,
        use_cpu_initialization=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        cuda_graph_impl="transformer_engine",
        cuda_graph_modules=[],
    )
    torch.manual_seed(0)
    # No final norm: with TE installed megatron-core picks TE's, which needs CUDA.
    block = TransformerBlock(config, get_gpt_layer_local_spec(), post_layer_norm=False, pg_collection=pgc)
    layers = list(block.layers)
    mask = ~torch.tril(torch.ones(SEQ, SEQ)).bool().view(1, 1, SEQ, SEQ)
    x = torch.randn(SEQ, MBS, HIDDEN)

    def forward_backward():
        block.zero_grad(set_to_none=True)
        h = x.clone().requires_grad_(True)
        out = block(h, attention_mask=mask)
        out.float().square().sum().backward()
        return out.detach(), h.grad, {n: p.grad.clone() for n, p in block.named_parameters()}

    ref_out, ref_dx, ref_grads = forward_backward()

    runs = group_runs(layers, ((0, 1), (1, 4)))
    run = runs[1]
    # The run's body is each layer's own capture body, one after the other.
    with torch.no_grad():
        h0 = layers[0](hidden_states=x, attention_mask=mask)[0]
        chained = h0
        for layer in layers[1:]:
            chained = layer._te_cuda_graph_capture(chained, attention_mask=mask)[0]
        assert torch.equal(run(h0, attention_mask=mask)[0], chained)

    calls = {"run": 0}

    def as_graph(callable_, key=None):
        """What a TE graph of ``callable_`` computes, with TE's signature (extra keyword arguments ignored)."""

        def graph(hidden_states, is_first_microbatch=None, **kwargs):
            if key:
                calls[key] += 1
            return callable_(hidden_states, **kwargs)

        return graph

    layers[0].cuda_graphs = [as_graph(layers[0]._te_cuda_graph_capture)]
    run.cuda_graphs = [as_graph(run, "run")]
    keys = sorted(block.state_dict())
    run.wire()
    wired_types = [type(layer) for layer in layers]
    wired_keys = sorted(block.state_dict())
    assert run.head.cuda_graphs and all(isinstance(layer, TransformerLayer) for layer in layers)

    out, dx, grads = forward_backward()
    routed = dict(
        calls=calls["run"],
        out_equal=torch.equal(out, ref_out),
        dx_equal=torch.equal(dx, ref_dx),
        grads_equal=sorted(grads) == sorted(ref_grads) and all(torch.equal(grads[n], ref_grads[n]) for n in grads),
    )

    # A member handed anything but the run's output refuses.
    with pytest.raises(RuntimeError, match="inside the captured run of layers 2-4"):
        layers[2](hidden_states=torch.randn(SEQ, MBS, HIDDEN), attention_mask=mask)

    # Evaluation: every layer computes itself (megatron-core's replay is for training calls only).
    block.eval()
    with torch.no_grad():
        eval_equal = torch.equal(block(x, attention_mask=mask), ref_eval := _eager(layers, x, mask))
    eval_calls = calls["run"]
    block.train()

    # The parameter-gather hooks of every layer of the run go to the head, which runs them before the graph.
    made = []
    run.setup_manual_hooks(lambda: made.append(1) or (lambda module: None))
    hooks = dict(
        head=len(run.head.cuda_graph_manual_hooks), members=[len(m.cuda_graph_manual_hooks) for m in layers[2:]]
    )

    run.unwire()
    keys_kept = wired_keys == keys == sorted(block.state_dict())
    restored = all(type(layer) is TransformerLayer for layer in layers) and not any(
        "_bcg_run" in layer.__dict__ for layer in layers
    )
    return dict(
        routed=routed,
        eval_equal=eval_equal,
        eval_finite=bool(torch.isfinite(ref_eval).all()),
        eval_calls=eval_calls,
        wired_member_class=wired_types[2].__name__,
        hooks=hooks,
        made=len(made),
        restored=restored,
        keys_kept=keys_kept,
        head_graphs_after=len(layers[1].cuda_graphs),
    )


def _eager(layers, x, mask):
    """The layers' own forward, one after the other (what the block computes in evaluation)."""
    h = x
    for layer in layers:
        h = layer.forward(hidden_states=h, attention_mask=mask)[0]
    return h


def test_a_run_replays_from_its_head_and_its_members_pass_through():
    from _dist import run_world

    (result,) = run_world(1, _cpu_block_world)
    # One call of the run per forward; output, input gradient and every parameter gradient bitwise the eager block's.
    assert result["routed"] == dict(calls=1, out_equal=True, dx_equal=True, grads_equal=True)
    assert result["wired_member_class"] == "RunMemberTransformerLayer"
    assert result["eval_equal"] and result["eval_finite"] and result["eval_calls"] == 1
    # Three layers' parameter-owning modules (layer norms, attention, MLP), all run by the head; members none.
    assert result["hooks"]["head"] == result["made"] > 0 and result["hooks"]["members"] == [0, 0]
    assert result["restored"] and result["head_graphs_after"] == 0 and result["keys_kept"]
