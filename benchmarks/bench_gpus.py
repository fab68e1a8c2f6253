"""The benchmark's full matrix in one call: configurations split over several GPUs, one child process each.

Each configuration still runs all its variants side by side in one process on one GPU (the comparison the
benchmark exists for); only *different* configurations run in parallel, on different GPUs. The parent splits them
by estimated cost (:func:`split_configs`), starts ``python -m benchmarks.bench --configs ...`` per GPU
(``CUDA_VISIBLE_DEVICES``, its own rendezvous port, no launcher variables), stops a child over its time limit, and
merges what every child wrote (a failed or stopped child loses only its unfinished configurations) into one
``bench.json``, rendered like a single run. Used by ``python -m benchmarks.bench --gpus N`` / ``--devices`` and
``scripts/bench_two_gpus.sh``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import bench_report
from benchmarks.bench_report import render
from benchmarks.configs import DEFAULT_MEASURED_STEPS, DEFAULT_ROUNDS, DEFAULT_WARMUP_STEPS, BenchConfig
from benchmarks.progress import say
from benchmarks.schema import FINISHED, command_line, json_safe

#: Building, snapshotting, capturing and checking one configuration, in tokens of one step (the rest of a
#: configuration's cost grows with its tokens per step). A rough figure from an H200 run
#: (results/padded-vs-upstream/README.md, "The benchmark's fixed cost"); it only has to order the configurations, not
#: predict seconds.
CONFIG_OVERHEAD_TOKENS = 1024
#: Seconds a timed-out child gets between SIGTERM and SIGKILL.
STOP_GRACE_S = 10.0
#: Lines of a failed child's log kept in bench.json.
LOG_TAIL_LINES = 40
#: Environment of a launcher (torchrun, Slurm) that would make a child join another world instead of its own.
_WORLD_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def tokens_per_step(cfg: BenchConfig) -> int:
    """Language tokens one training step processes (the images' patches grow with them: the data fills a fixed
    fraction of every sequence)."""
    return cfg.seq_length * cfg.micro_batch_size * cfg.num_microbatches


def estimated_cost(cfg: BenchConfig) -> float:
    """A configuration's relative cost: its tokens per step plus a fixed :data:`CONFIG_OVERHEAD_TOKENS`."""
    return float(tokens_per_step(cfg) + CONFIG_OVERHEAD_TOKENS)


def split_configs(configs: Sequence[BenchConfig], n: int) -> list[list[BenchConfig]]:
    """``configs`` in at most ``n`` groups of balanced :func:`estimated_cost`, one per GPU.

    Greedy longest-first (each configuration, heaviest first, joins the lightest group so far): it puts the
    heaviest configuration (small-mbs2-seq4096) in a group of its own or with the cheapest ones, and never two heavy
    ones together. Within a group the configurations run cheapest first, so a time limit loses the fewest. Empty
    groups are dropped; the result is deterministic.
    """
    if n < 1:
        raise ValueError(f"need at least one group, got {n}")
    groups: list[list[BenchConfig]] = [[] for _ in range(min(n, len(configs)))]
    loads = [0.0] * len(groups)
    position = {c.name: i for i, c in enumerate(configs)}
    for cfg in sorted(configs, key=lambda c: (-estimated_cost(c), position[c.name])):
        lightest = min(range(len(groups)), key=lambda g: (loads[g], g))
        groups[lightest].append(cfg)
        loads[lightest] += estimated_cost(cfg)
    return [sorted(g, key=lambda c: (estimated_cost(c), position[c.name])) for g in groups if g]


def resolve_devices(gpus: int | None, devices: str | Sequence[str] | None, visible: str | None) -> list[str]:
    """The GPUs the children run on, as ``CUDA_VISIBLE_DEVICES`` values: ``devices`` as given, or the first
    ``gpus`` of this process's ``visible`` devices (``CUDA_VISIBLE_DEVICES``; ``0..gpus-1`` when unset)."""
    if devices:
        chosen = [d.strip() for d in devices.split(",")] if isinstance(devices, str) else [str(d) for d in devices]
        chosen = [d for d in chosen if d]
        if not chosen or len(set(chosen)) != len(chosen):
            raise ValueError(f"--devices needs distinct device ids, got {devices!r}")
        return chosen
    if gpus is None or gpus < 1:
        raise ValueError(f"--gpus needs a positive number, got {gpus!r}")
    if visible is None or not visible.strip():
        return [str(i) for i in range(gpus)]
    listed = [d.strip() for d in visible.split(",") if d.strip()]
    if gpus > len(listed):
        raise ValueError(f"--gpus {gpus}, but CUDA_VISIBLE_DEVICES lists only {len(listed)}: {visible}")
    return listed[:gpus]


def cpu_sets(available: Sequence[int], n: int) -> list[list[int]]:
    """``available`` CPUs (sorted) in ``n`` contiguous, disjoint sets of near-equal size, one per child; ``n``
    empty sets (no pinning) when there are fewer CPUs than children.

    Why: the steps measured are host-bound, so two children sharing cores (and each starting an OpenMP pool as
    wide as the machine) slow each other down by amounts that change from step to step. Contiguous ids keep a
    child on one socket on the usual numbering."""
    cpus = sorted(available)
    if n < 1:
        raise ValueError(f"need at least one set, got {n}")
    if len(cpus) < n:
        return [[] for _ in range(n)]
    size, extra = divmod(len(cpus), n)
    sets, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        sets.append(cpus[start:end])
        start = end
    return sets


def cpu_list(cpus: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` as ``"0-2,5"`` (taskset's notation), ``""`` for none."""
    parts = []
    # Consecutive ids share ``id - position``: each group is one run.
    for _, group in itertools.groupby(enumerate(sorted(cpus)), key=lambda pair: pair[1] - pair[0]):
        run = [cpu for _, cpu in group]
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)


@dataclass
class Child:
    """One child process of ``--gpus``: its GPU, configurations and output folder, and what became of it."""

    index: int
    device: str
    configs: list[str]
    out_dir: Path
    argv: list[str]
    #: The CPUs it is pinned to (empty: not pinned).
    cpus: list[int] = field(default_factory=list)
    returncode: int | None = None
    timed_out: bool = False
    seconds: float = 0.0

    @property
    def log_path(self) -> Path:
        """Its stdout and stderr."""
        return self.out_dir / "bench.log"

    @property
    def json_path(self) -> Path:
        """Its bench.json (rewritten after every variant)."""
        return self.out_dir / "bench.json"

    def status(self) -> str:
        """``ok``, ``timed out after N s``, ``exit code N``, or ``not finished``."""
        if self.timed_out:
            return f"timed out after {self.seconds:.0f} s"
        if self.returncode is None:
            return "not finished"
        return "ok" if self.returncode == 0 else f"exit code {self.returncode}"


def child_argv(options: argparse.Namespace, names: Sequence[str], out_dir: Path) -> list[str]:
    """The command line of a child: this module on ``names`` into ``out_dir``, with the parent's step, round,
    profile, variant and control options (never ``--gpus``/``--devices``/``--time-limit``: a child runs in-process)."""
    argv = [sys.executable, "-m", "benchmarks.bench", "--out", str(out_dir), "--configs", ",".join(names)]
    argv += ["--measured-steps", str(int(getattr(options, "measured_steps", None) or DEFAULT_MEASURED_STEPS))]
    warmup = getattr(options, "warmup_steps", None)
    argv += ["--warmup-steps", str(int(DEFAULT_WARMUP_STEPS if warmup is None else warmup))]
    variants = getattr(options, "variants", None)
    if variants:
        argv += ["--variants", variants if isinstance(variants, str) else ",".join(variants)]
    argv += ["--rounds", str(int(getattr(options, "rounds", None) or DEFAULT_ROUNDS))]
    if getattr(options, "no_profile", False):
        argv.append("--no-profile")
    if getattr(options, "no_control", False):
        argv.append("--no-control")
    if getattr(options, "no_paired", False):
        argv.append("--no-paired")
    if getattr(options, "paired_with", None):
        argv += ["--paired-with", str(options.paired_with)]
    if getattr(options, "lever_pairs", None):
        argv += ["--lever-pairs", str(options.lever_pairs)]
    return argv


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports (held open together while chosen, so no two children get the same one)."""

    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def child_env(base: dict[str, str], device: str, port: int, cpus: Sequence[int] = ()) -> dict[str, str]:
    """A child's environment: one visible GPU, a one-process world of its own on ``port`` (a launcher's
    ``RANK``/``MASTER_PORT`` would make the children collide), unbuffered output for a live log, and, when it is
    pinned to ``cpus``, an OpenMP pool no wider than them (unless the caller set ``OMP_NUM_THREADS``)."""
    env = {k: v for k, v in base.items() if k not in _WORLD_ENV}
    env.update(CUDA_VISIBLE_DEVICES=device, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONUNBUFFERED="1")
    if cpus and "OMP_NUM_THREADS" not in base:
        env["OMP_NUM_THREADS"] = str(len(cpus))
    return env


def _stop(proc: Any, grace_s: float) -> None:
    """SIGTERM the child's process group (it was started in a session of its own), then SIGKILL after
    ``grace_s``."""

    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


class _Terminated(Exception):
    """The parent got SIGTERM: stop the children, keep what they wrote."""


def run_children(
    children: Sequence[Child],
    *,
    time_limit_s: float | None = None,
    poll_s: float = 1.0,
    grace_s: float = STOP_GRACE_S,
    env: dict[str, str] | None = None,
) -> None:
    """Start every child at once (each in a session of its own, output to its log), wait for all, stop one that
    runs past ``time_limit_s``; fills in their ``returncode``/``timed_out``/``seconds``. If the parent is
    interrupted or terminated, the children still running are stopped before this returns (what they wrote stays).
    """

    ports = _free_ports(len(children))
    running: dict[int, tuple[Any, Any, float]] = {}

    def on_term(signum: int, frame: Any) -> None:
        raise _Terminated

    previous = None
    with contextlib.suppress(ValueError):  # not the main thread: no handler, the finally still stops them
        previous = signal.signal(signal.SIGTERM, on_term)
    try:
        for child, port in zip(children, ports, strict=True):
            child.out_dir.mkdir(parents=True, exist_ok=True)
            log = open(child.log_path, "w")  # closed when the child ends (below, or in the finally)
            proc = subprocess.Popen(
                child.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_env(dict(os.environ if env is None else env), child.device, port, child.cpus),
                start_new_session=True,
                preexec_fn=functools.partial(os.sched_setaffinity, 0, child.cpus) if child.cpus else None,
            )
            running[child.index] = (proc, log, time.monotonic())
            pinned = f", CPUs {cpu_list(child.cpus)}" if child.cpus else ""
            names = ", ".join(child.configs)
            say(f"child {child.index} on GPU {child.device}{pinned}: {names} (log {child.log_path})")
        by_index = {c.index: c for c in children}
        while running:
            for index, (proc, log, started) in list(running.items()):
                child = by_index[index]
                child.seconds = time.monotonic() - started
                if proc.poll() is None and time_limit_s is not None and child.seconds > time_limit_s:
                    say(f"child {index} on GPU {child.device}: over the {time_limit_s:g} s limit, stopping it")
                    child.timed_out = True
                    _stop(proc, grace_s)
                if proc.poll() is not None:
                    child.returncode = proc.returncode
                    log.close()
                    del running[index]
                    say(f"child {index} on GPU {child.device}: {child.status()} ({child.seconds:.0f} s)")
            if running:
                time.sleep(poll_s)
    except (KeyboardInterrupt, _Terminated):
        say("interrupted: stopping the children, keeping what they wrote")
    finally:
        for index, (proc, log, started) in running.items():
            _stop(proc, grace_s)
            child = next(c for c in children if c.index == index)
            child.returncode, child.seconds = proc.returncode, time.monotonic() - started
            log.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log ("" when there is none)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def collect_children(children: Sequence[Child], *, order: Sequence[str], meta: dict | None = None) -> dict:
    """One bench.json content from the children's: their configurations merged (:func:`bench_report.merge_data`),
    every configuration of a child that did not finish it marked failed or incomplete with the child's fate and its
    log's tail (:func:`bench_report.mark_unfinished`), ``meta["children"]`` saying who ran what. ``meta`` (the
    parent's) fills in what no child wrote and overrides the command."""
    datas = []
    for child in children:
        if child.json_path.exists():
            try:
                datas.append(json.loads(child.json_path.read_text()))
            except (OSError, ValueError) as error:
                say(f"child {child.index}: unreadable {child.json_path}: {error}")
    merged = bench_report.merge_data(datas, order=order)
    merged["meta"] = {**(meta or {}), **{k: v for k, v in merged["meta"].items() if v is not None}}
    if meta and meta.get("command"):
        merged["meta"]["command"] = meta["command"]
    unfinished: dict[str, dict[str, Any]] = {}
    for child in children:
        why = {
            "error": f"its process (child {child.index}, GPU {child.device}) ended with {child.status()} before "
            "finishing it",
            "log": str(child.log_path),
            "log_tail": log_tail(child.log_path),
        }
        for name in child.configs:
            unfinished[name] = why
    done = {c.get("name") for c in merged["configs"] if c.get("status") in (None, FINISHED)}
    bench_report.mark_unfinished(merged, {k: v for k, v in unfinished.items() if k not in done})
    merged["configs"].sort(key=lambda c: order.index(c["name"]) if c.get("name") in order else len(order))
    merged["meta"]["children"] = [
        {
            "index": c.index,
            "device": c.device,
            "configs": list(c.configs),
            "status": c.status(),
            "returncode": c.returncode,
            "timed_out": c.timed_out,
            "seconds": c.seconds,
            "cpus": cpu_list(c.cpus),
            "out_dir": str(c.out_dir),
        }
        for c in children
    ]
    return merged


def run_on_gpus(
    configs: Sequence[BenchConfig],
    devices: Sequence[str],
    *,
    out_dir: str | Path,
    make_argv: Callable[[Sequence[str], Path], list[str]],
    time_limit_s: float | None = None,
    command: str | None = None,
    env: dict[str, str] | None = None,
    poll_s: float = 1.0,
    grace_s: float = STOP_GRACE_S,
    pin_cpus: bool = True,
) -> tuple[dict, list[Child]]:
    """The full matrix in one call: ``configs`` split over ``devices`` (:func:`split_configs`), one child process
    per GPU (``make_argv(names, child_out_dir)``: injectable, tests use a fake child), each child running all
    variants of its configurations side by side in one process on its GPU; then ``out_dir/bench.json`` merged
    from what every child wrote (a child that failed or timed out loses only its unfinished configurations) and
    rendered. ``pin_cpus``: each child on its own share of this process's CPUs (:func:`cpu_sets`). Returns the
    merged content and the children."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    groups = split_configs(configs, len(devices))
    pins = cpu_sets(sorted(os.sched_getaffinity(0)), len(groups)) if pin_cpus else [[] for _ in groups]
    children = []
    for i, (group, device) in enumerate(zip(groups, devices, strict=False)):
        names = [c.name for c in group]
        child_out = out / f"part{i}-gpu{device}"
        children.append(Child(i, device, names, child_out, make_argv(names, child_out), cpus=pins[i]))
    say(
        "split: "
        + "; ".join(
            f"GPU {c.device}" + (f" (CPUs {cpu_list(c.cpus)})" if c.cpus else "") + f": {', '.join(c.configs)}"
            for c in children
        )
        + (f" (time limit {time_limit_s:g} s per child)" if time_limit_s else "")
    )
    run_children(children, time_limit_s=time_limit_s, env=env, poll_s=poll_s, grace_s=grace_s)
    meta = {
        "command": command or command_line(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "time_limit_s": time_limit_s,
    }
    data = collect_children(children, order=[c.name for c in configs], meta=meta)
    json_path = out / "bench.json"
    json_path.write_text(json.dumps(json_safe(data), indent=2))
    try:
        render(json_path)
    except Exception as error:
        say(f"render failed ({type(error).__name__}: {error}); run bench_report render {json_path}")
    for child in children:
        if child.status() != "ok":
            say(f"child {child.index} on GPU {child.device}: {child.status()}; last lines of {child.log_path}:")
            print(log_tail(child.log_path, 15), flush=True)
    return data, children
