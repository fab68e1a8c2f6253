"""capture.block_replay: the one layer loop every replay runs (the language decoder's and the vision encoder's), on
the CPU with plain callables in place of graphs (the graphs themselves need a GPU: tests/gpu)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from bridge_cudagraph.capture.block_replay import replay_segments


def _block(layers: int, calls: list) -> SimpleNamespace:
    """A block's attributes the loop reads: its config's sequence parallelism and its layers' manual hooks (each
    records its layer when run)."""

    def layer(i: int) -> SimpleNamespace:
        return SimpleNamespace(cuda_graph_manual_hooks=[(calls.append, (f"hook {i}",))])

    return SimpleNamespace(config=SimpleNamespace(sequence_parallel=False), layers=[layer(i) for i in range(layers)])


def _graph(name: str, calls: list):
    def run(h, *statics):
        calls.append(f"{name}{statics}")
        return h + 1

    return run


def test_each_segments_hooks_run_before_its_graph_and_what_follows_it_after():
    calls: list = []
    segments = ((0, 2), (2, 3), (3, 5))
    graphs = [_graph(f"graph {end}", calls) for _, end in segments]

    def after(end, h):
        calls.append(f"after {end}")
        return h * 10 if end == 3 else h

    out = replay_segments(_block(5, calls), graphs, torch.zeros(1), ("s",), segments, after_segment=after)
    assert calls == [
        "hook 0",
        "hook 1",
        "graph 2('s',)",
        "after 2",
        "hook 2",
        "graph 3('s',)",
        "after 3",
        "hook 3",
        "hook 4",
        "graph 5('s',)",
        "after 5",
    ]
    assert out.item() == ((0 + 1 + 1) * 10) + 1  # what follows a segment goes on into the next


def test_without_anything_after_a_segment_the_graphs_chain():
    calls: list = []
    segments = ((0, 1), (1, 2))
    graphs = [_graph(f"graph {end}", calls) for _, end in segments]
    out = replay_segments(_block(2, calls), graphs, torch.zeros(1), (), segments)
    assert out.item() == 2 and calls == ["hook 0", "graph 1()", "hook 1", "graph 2()"]
