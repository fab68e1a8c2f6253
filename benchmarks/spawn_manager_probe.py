"""How long megatron-core's write-results queue takes to start, by what the launching script imports.

Bridge's checkpoint save calls megatron-core's ``get_write_results_queue()`` (``dist_checkpointing/strategies/
filesystem_async.py``), a ``spawn`` multiprocessing Manager; the spawned child re-imports the launching ``__main__``
before it serves. This probe starts that same queue from two scripts that have imported the same stack (torch and
``megatron.bridge``), one at module level (as ``tests/gpu/_bridge_runner.py`` did until 2026-12-01), one inside its
``main()`` (as ``bridge-cudagraph train`` does), and prints one JSON line per start::

    python -m benchmarks.spawn_manager_probe [--repeats 3]

No GPU needed; the numbers are the host's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

_BODY = """
import time
{top}
def main():
{inner}
    from megatron.core.dist_checkpointing.strategies.filesystem_async import get_write_results_queue
    t = time.perf_counter()
    get_write_results_queue()
    print(time.perf_counter() - t)
if __name__ == "__main__":
    main()
"""
_IMPORTS = "import torch\nfrom megatron.bridge.training.callbacks import Callback\n"


def _script(heavy_top: bool) -> str:
    top = _IMPORTS if heavy_top else ""
    inner = "    pass\n" if heavy_top else "".join(f"    {line}\n" for line in _IMPORTS.splitlines())
    return _BODY.format(top=top, inner=inner)


def main(argv: list[str] | None = None) -> int:
    """Time the queue's start ``--repeats`` times from each script; one JSON line per start."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        for name, heavy in (("imports_at_module_level", True), ("imports_inside_main", False)):
            path = Path(tmp) / f"{name}.py"
            path.write_text(_script(heavy))
            for repeat in range(args.repeats):  # a line per start, flushed: a call cut short keeps what ran
                done = subprocess.run(
                    [sys.executable, str(path)], capture_output=True, text=True, env=dict(os.environ), check=True
                )
                seconds = round(float(done.stdout.strip().splitlines()[-1]), 3)
                print(json.dumps({"script": name, "repeat": repeat, "queue_start_s": seconds}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
