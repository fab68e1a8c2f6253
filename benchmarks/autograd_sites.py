"""Which lines of code build the autograd nodes of one packed training micro-batch, and what each kind costs the host.

Why: the packed step's profile names backward ops that leave the GPU idle (``IndexBackward0``, ``AccumulateGrad``) but
not who created them; an op name alone does not say whether Bridge's model, Megatron's layers, TE or this plugin asked
for it. In anomaly mode torch keeps, on every autograd node, the Python stack of the forward that made it; walking the
graph from the loss then attributes each node to the innermost frame outside torch (the line of Megatron, Bridge, TE
or this plugin), as :mod:`benchmarks.host_syncs` does for host waits.

Usage (one GPU; the useful-tokens benchmark's model, data and arguments)::

    python -m benchmarks.autograd_sites --out DIR --model small --seq 4096 --mbs 2 --num-mb 2 \\
        --variants eager_packed,ours_packed

For each variant: build it, warm up and capture as :mod:`benchmarks.useful_tokens` does, one training step under
:func:`benchmarks.host_syncs.census` (which lines make the host wait), then the fixed micro-batch's forward in anomaly
mode; ``DIR/autograd_sites.json`` holds, per variant, every node type with its count and its
creation sites, and the table printed last lists the types that matter to the host.
"""

from __future__ import annotations

import collections
import json
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.host_syncs import frame_site


def site_of(stack: Sequence[Any]) -> str:
    """The innermost frame outside torch of a creation stack (anomaly mode's ``traceback_`` strings, or
    :class:`traceback.FrameSummary` entries), with its caller (:func:`benchmarks.host_syncs.frame_site`)."""
    frames: list[traceback.FrameSummary] = []
    for entry in stack:
        frames.extend([entry] if isinstance(entry, traceback.FrameSummary) else _parse(str(entry)))
    return frame_site(frames, depth=2, skip="benchmarks/autograd_sites.py")


def _parse(text: str) -> list[traceback.FrameSummary]:
    """The ``File "x.py", line 3, in f`` lines of a formatted stack, as frames."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith('File "'):
            continue
        try:
            path, rest = line[6:].split('", line ', 1)
            number, _, name = rest.partition(", in ")
            out.append(traceback.FrameSummary(path, int(number), name.strip(), line=None))
        except ValueError:
            continue
    return out


#: The site of a node without a creation stack (a leaf's AccumulateGrad, or a node made outside anomaly mode).
NO_STACK = "(no creation stack: a leaf or a node made outside anomaly mode)"


def walk(root: Any) -> dict[str, dict[str, Any]]:
    """Every node reachable from ``root`` (a ``grad_fn``) by type: ``{type: {"count": n, "sites": {site: n}}}``."""
    # Keyed by id with the node kept alive: a node's Python object may be made anew at each access and its id
    # reused once it is freed, which would end the walk early at nodes it never saw.
    seen: dict[int, Any] = {}
    out: dict[str, dict[str, Any]] = {}
    todo = [root]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        name = node.name()
        rec = out.setdefault(name, {"count": 0, "sites": collections.Counter()})
        rec["count"] += 1
        stack = (getattr(node, "metadata", None) or {}).get("traceback_")
        rec["sites"][site_of(stack) if stack else NO_STACK] += 1
        todo.extend(fn for fn, _ in node.next_functions)
    return {k: {"count": v["count"], "sites": v["sites"].most_common()} for k, v in out.items()}


def _variant_sites(run: Any, variant: str) -> dict[str, Any]:
    import torch

    from benchmarks import bench
    from benchmarks import useful_tokens as ut
    from benchmarks.host_syncs import census
    from bridge_cudagraph.testing.parity import per_token_loss

    shared = run.shared[ut.FORM[variant]]
    objs: dict = {}
    try:
        ut._build(run, variant, objs)
        helpers = objs["helpers"] = ut._helpers(run, variant, objs)
        run_step = bench._step_runner(shared, objs, losses=[], grad_norms=[])
        for i in range(shared.warmup_steps):
            run_step(i)
        if helpers:
            bench._capture("ours", helpers)
        # One training step under sync debug mode: which lines make the host wait (its sites now name Megatron's and
        # Bridge's frames on the device too, see host_syncs.torch_dir).
        syncs = census(lambda: run_step(shared.warmup_steps))
        t0 = time.perf_counter()
        with torch.autograd.set_detect_anomaly(True, check_nan=False):
            loss = per_token_loss(objs["model"], shared.fixed_batch)
        nodes = walk(loss.grad_fn)
        del loss
        replays = {h.submodule: h.stats.replays for h in helpers if hasattr(h, "stats")}
        return {
            "status": "ok",
            "forward_s": time.perf_counter() - t0,
            "replays": replays,
            "host_syncs": syncs,
            "nodes": nodes,
        }
    except Exception as error:
        return {"status": "failed", "error": f"{type(error).__name__}: {error}"[:500]}
    finally:
        ut._release(objs)


#: Node types the packed step's profile shows leaving the GPU idle, listed first in the table.
WATCHED = ("IndexBackward0", "IndexPutBackward0", "AccumulateGrad", "CopySlices", "AddBackward0", "GraphedBackward")


def table(result: dict[str, Any]) -> str:
    """Per variant, the watched node types' counts and their top sites."""
    lines = []
    for variant, rec in result["variants"].items():
        if rec.get("status") != "ok":
            lines.append(f"{variant}: {rec.get('status')}: {rec.get('error')}")
            continue
        lines.append(f"{variant}: {sum(n['count'] for n in rec['nodes'].values())} nodes, replays {rec['replays']}")
        syncs = rec.get("host_syncs") or {}
        if syncs:
            lines.append(f"  host waits in one step: {syncs.get('total')}")
            lines.extend(f"      {n} x {site}" for site, n in (syncs.get("sites") or [])[:8])
        names = sorted(
            rec["nodes"], key=lambda n: (not any(n.endswith(w) for w in WATCHED), -rec["nodes"][n]["count"])
        )
        for name in names[:14]:
            node = rec["nodes"][name]
            lines.append(f"  {name}: {node['count']}")
            for site, n in node["sites"][:4]:
                lines.append(f"      {n} x {site}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: the benchmark's arguments (``--variants`` picks the variants, default eager_packed and
    ours_packed); exit 2 with one ``error:`` line on bad input, 1 when a variant failed."""
    import torch

    from benchmarks import bench
    from benchmarks import useful_tokens as ut
    from bridge_cudagraph.parallel.layout import VisionLayout
    from bridge_cudagraph.testing.world import close_world, init_world

    args = ut.parse_args(argv)
    problem = ut.check_args(args)
    if problem is None and not torch.cuda.is_available():
        problem = "no CUDA GPU: the probe builds the benchmark's model on one"
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    variants = (args.variants or "eager_packed,ours_packed").split(",")
    world = init_world(vision=VisionLayout(), seed=bench.SEED)
    try:
        run = ut.prepare(args, world)
        command = ut.command_line(argv).replace("benchmarks.useful_tokens", "benchmarks.autograd_sites", 1)
        result: dict[str, Any] = {"meta": ut._meta(args, run.cfg, command), "variants": {}}
        for variant in variants:
            result["variants"][variant] = _variant_sites(run, variant)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "autograd_sites.json").write_text(json.dumps(result, indent=1))
        print(table(result), flush=True)
        return 0 if all(r.get("status") == "ok" for r in result["variants"].values()) else 1
    finally:
        close_world(world)


if __name__ == "__main__":
    raise SystemExit(main())
