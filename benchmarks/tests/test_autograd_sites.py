"""The autograd-sites probe's graph walk on a CPU graph: counts by type and the creating line, not torch's own."""

import inspect
import os

import torch

from benchmarks.autograd_sites import site_of, table, walk
from benchmarks.host_syncs import torch_dir


def _forward(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    picked = x[index]  # IndexBackward0, created on this line
    return (picked * 2).sum() + x[0].sum()


def test_walk_attributes_each_node_to_the_line_that_made_it():
    x = torch.randn(5, 3, requires_grad=True)
    index = torch.tensor([0, 2, 2])
    with torch.autograd.set_detect_anomaly(True, check_nan=False):
        loss = _forward(x, index)
    nodes = walk(loss.grad_fn)
    assert nodes["IndexBackward0"]["count"] == 1
    assert nodes["torch::autograd::AccumulateGrad"]["count"] == 1  # one leaf, reached twice, counted once
    (site, n), *_ = nodes["IndexBackward0"]["sites"]
    line = inspect.getsourcelines(_forward)[1] + 1  # the line of `picked = x[index]`
    assert n == 1 and f"test_autograd_sites.py:{line} _forward" in site, site
    assert "torch/" not in site.split(" <- ")[0]


def test_nodes_without_anomaly_mode_say_so():
    x = torch.randn(2, requires_grad=True)
    nodes = walk((x * 3).sum().grad_fn)
    assert nodes["MulBackward0"]["sites"][0][0].startswith("(no creation stack")


def test_site_of_formatted_frames_skips_torch_and_keeps_the_caller():
    here = os.path.join(os.getcwd(), "bridge_cudagraph", "host", "forward.py")
    stack = [
        f'  File "{here}", line 290, in _deepstack_process\n    x = y\n',
        f'  File "{torch_dir()}_tensor.py", line 10, in __getitem__\n    z\n',
    ]
    outer = '  File "/x/site-packages/megatron/core/block.py", line 7, in forward\n    w\n'
    assert site_of([outer, *stack]) == (
        "bridge_cudagraph/host/forward.py:290 _deepstack_process <- megatron/core/block.py:7 forward"
    )


def test_table_lists_watched_types_first():
    result = {
        "variants": {
            "v": {
                "status": "ok",
                "replays": {},
                "nodes": {
                    "MulBackward0": {"count": 9, "sites": [["a.py:1 f", 9]]},
                    "IndexBackward0": {"count": 2, "sites": [["b.py:2 g", 2]]},
                },
            },
            "w": {"status": "failed", "error": "boom"},
        }
    }
    text = table(result).splitlines()
    assert text[1] == "  IndexBackward0: 2" and text[3] == "  MulBackward0: 9" and text[-1] == "w: failed: boom"


def test_walk_reaches_every_node_of_a_deep_graph():
    """A deep chain: every node is counted once (a walk that lets node objects die can stop at a reused id)."""
    x = torch.randn(4, requires_grad=True)
    y = x
    for _ in range(500):
        y = y * 1.5 + 1
    nodes = walk(y.sum().grad_fn)
    assert nodes["MulBackward0"]["count"] == 500 and nodes["AddBackward0"]["count"] == 500, nodes.keys()
