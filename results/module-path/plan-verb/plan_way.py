"""The way of a ``bridge-cudagraph plan`` call through the product, on the CPU: the planning half of ``train``'s way.

``python results/module-path/plan-verb/plan_way.py RECIPE OUT.json`` runs ``plan`` under
:class:`benchmarks.module_path.ModuleWay`'s hook and writes its summary (modules, folder visits and returns) with
every call that entered a module from another: ``(caller module, caller function, callee module, callee function)``
and how often, most frequent first. It shows what the folder returns are made of; ``without_data_calls`` is the
same summary without the entries a data object's dunder (``__setattr__``, ``__post_init__``) or a host caller made.
"""

from __future__ import annotations

import collections
import json
import os
import runpy
import shlex
import sys
from pathlib import Path

from benchmarks.module_path import ModuleWay, summarize
from benchmarks.runner import run_meta


class CallingWay(ModuleWay):
    """:class:`ModuleWay` that also keeps the caller's and the callee's function of every entry."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, on_replay=lambda way: None)
        self.calls: collections.Counter = collections.Counter()
        self.control: list[str] = []

    def _started(self, code, instruction_offset: int):
        callee = None if code.co_name == "<module>" else self.module_of(code.co_filename)
        if callee is None:
            return sys.monitoring.DISABLE
        caller_frame = sys._getframe(1).f_back
        caller = caller_frame and self.module_of(caller_frame.f_code.co_filename)
        if caller != callee:
            self.entries.append(callee)
            self.calls[(caller, caller_frame and caller_frame.f_code.co_name, callee, code.co_name)] += 1
            if caller is not None and not code.co_name.startswith("__"):
                self.control.append(callee)
        return None


def main(recipe: str, out: str) -> int:
    """Plan ``recipe`` under the hook; write the summary and the calls to ``out``."""
    import bridge_cudagraph

    meta = run_meta(f"PYTHONPATH=. python {shlex.join([os.path.relpath(__file__), recipe, out])}")
    meta["gpu"] = meta["gpu"] or "none: a CPU run"
    way = CallingWay(Path(bridge_cudagraph.__file__).resolve().parent)
    sys.argv = ["bridge-cudagraph", "plan", recipe]
    way.start()
    try:
        runpy.run_module("bridge_cudagraph", run_name="__main__")
    except SystemExit:
        pass
    finally:
        way.stop()
    calls = [{"call": list(key), "count": count} for key, count in way.calls.most_common()]
    record = {"meta": meta, "recipe": recipe, **summarize(way.entries)}
    record.update(without_data_calls=summarize(way.control), calls=calls)
    Path(out).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
