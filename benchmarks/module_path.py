"""Which product modules a ``bridge-cudagraph train`` call runs before its first graph replay, in the order it first
enters each, and which folders its way returns to after leaving them.

``python -m benchmarks.module_path RECIPE --out OUT [key=value ...]`` runs ``train`` in this process under
:class:`ModuleWay` and writes ``OUT/module_path.json`` (:func:`summarize`) at the first replay; a run that never
replays writes ``"replayed": false`` and the way as far as it went."""

from __future__ import annotations

import argparse
import collections
import json
import os
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["ModuleWay", "main", "summarize"]

PACKAGE = "bridge_cudagraph"
#: The function whose first call ends the way: the layer loop every replay runs.
FIRST_REPLAY = ("block_replay", "replay_segments")
#: The folder the way may return to: the host adapters, reached from everywhere.
HOST = "host"


class ModuleWay:
    """The hook: records, for every call whose callee lies in ``root`` (the package's folder), the callee's module
    when its caller's module differs (an import is not a call), until :data:`FIRST_REPLAY` is called."""

    TOOL = sys.monitoring.PROFILER_ID
    #: A function's start and a generator's resumption.
    EVENTS = (sys.monitoring.events.PY_START, sys.monitoring.events.PY_RESUME)

    def __init__(self, root: Path, on_replay) -> None:
        self.root = str(root) + os.sep
        self.on_replay = on_replay
        self.entries: list[str] = []
        self.done = False

    def module_of(self, filename: str) -> str | None:
        """``folder/module`` of a file under the package (``cli`` for a top-level one), or None outside it."""
        if not filename.startswith(self.root) or not filename.endswith(".py"):
            return None
        return filename[len(self.root) : -3].replace(os.sep, "/")

    def start(self) -> None:
        """Listen to every function start from now on (:data:`TOOL` must be free)."""
        monitoring = sys.monitoring
        monitoring.use_tool_id(self.TOOL, "benchmarks.module_path")
        for event in self.EVENTS:
            monitoring.register_callback(self.TOOL, event, self._started)
        monitoring.set_events(self.TOOL, self.EVENTS[0] | self.EVENTS[1])

    def stop(self) -> None:
        """Stop listening and give :data:`TOOL` back (again is harmless)."""
        monitoring = sys.monitoring
        if monitoring.get_tool(self.TOOL) is None:
            return
        monitoring.set_events(self.TOOL, 0)
        for event in self.EVENTS:
            monitoring.register_callback(self.TOOL, event, None)
        monitoring.free_tool_id(self.TOOL)

    def _started(self, code, instruction_offset: int):
        callee = None if self.done or code.co_name == "<module>" else self.module_of(code.co_filename)
        if callee is None:  # outside the package, an import, or after the first replay: never again here
            return sys.monitoring.DISABLE
        started = sys._getframe(1)  # the frame of ``code``: this callback's caller
        caller = started.f_back and self.module_of(started.f_back.f_code.co_filename)
        if caller != callee:
            self.entries.append(callee)
        if (callee.rsplit("/", 1)[-1], code.co_name) == FIRST_REPLAY:
            self.done = True
            sys.monitoring.set_events(self.TOOL, 0)
            self.on_replay(self)
        return None


def _folder(module: str) -> str:
    return module.split("/", 1)[0] if "/" in module else "."


def summarize(entries: Sequence[str]) -> dict[str, Any]:
    """The distinct modules in first-entry order with how often the way entered each from another module; the folders
    in the order the way walks them (a trip into ``host`` and back does not leave one); the folders it returns to."""
    modules = collections.Counter(entries)  # in first-entry order
    visits: list[str] = []
    for module in entries:
        folder = _folder(module)
        if folder != HOST and (not visits or visits[-1] != folder):
            visits.append(folder)
    returns = {f: visits.count(f) - 1 for f in dict.fromkeys(visits) if visits.count(f) > 1}
    return {
        "module_count": len(modules),
        "modules": [{"module": m, "entries": n} for m, n in modules.items()],
        "folder_visits": visits,
        "folder_returns": returns,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Train the recipe under the hook until its first replay; the train call's exit code."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe")
    parser.add_argument("--out", required=True, type=Path)
    args, overrides = parser.parse_known_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / "module_path.json"
    command = ["train", args.recipe, *overrides]
    from benchmarks.runner import command_line, run_meta  # torch and the versions, before the hook listens

    record: dict[str, Any] = {
        "meta": run_meta(command_line("benchmarks.module_path", [args.recipe, *overrides])),
        "replayed": False,
    }

    def on_replay(way: ModuleWay) -> None:
        record.update(replayed=True, **summarize(way.entries))
        target.write_text(json.dumps(record, indent=1) + "\n")

    import bridge_cudagraph

    way = ModuleWay(Path(bridge_cudagraph.__file__).resolve().parent, on_replay)
    target.write_text(json.dumps(record, indent=1) + "\n")
    sys.argv = ["bridge-cudagraph", *command]
    way.start()
    try:
        runpy.run_module(PACKAGE, run_name="__main__")
    except SystemExit as end:
        code = end.code if isinstance(end.code, int) else (0 if end.code is None else 1)
    else:
        code = 0
    finally:
        way.stop()
    if not way.done:  # the way as far as it went (a refusal, a run without graphs)
        record.update(summarize(way.entries))
        target.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: record.get(k) for k in ("replayed", "module_count", "folder_returns")}))
    return code


if __name__ == "__main__":
    sys.exit(main())
