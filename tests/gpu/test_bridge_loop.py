"""The tiny Qwen3-VL recipe through Megatron-Bridge's real training loop, graphs on and off, on one GPU.

Seven Bridge runs, each in its own process (``_bridge_runner.py`` under ``torch.distributed.run``), same seed and
same data:

* ``graphs_on``: 50 iterations with the recipe's language and vision graphs, checkpoints at 30 and 50;
* ``graphs_off``: the same without graphs;
* then, at the same time (they only read those checkpoints; nothing of theirs is timed but their exit):

  * ``resumed``: graphs on, resumed from ``graphs_on``'s checkpoint at 30 and trained to 50;
  * ``resumed_off_from_on``: graphs off, resumed from ``graphs_on``'s checkpoint at 30;
  * ``resumed_on_from_off``: graphs on, resumed from ``graphs_off``'s checkpoint at 30 (captures again at 33);
  * ``fused_on`` and ``fused_off``: 50 iterations, graphs on and off, with Bridge's default
    ``model.gradient_accumulation_fusion=true`` that the recipe turns off (:mod:`bridge_cudagraph.host.wgrad_fusion`).

Checked: the CudaGraphCallback captured after warmup (again after resume) and nothing failed; both runs start
from the same weights; the loss at every iteration is identical to graphs-off and finite (NaN-safe:
``parity.compare_series``), the evaluation losses (iterations 20 and 40, mid-training) equal graphs-off within 1e-3;
identical checkpoint keys; every resumed run's losses at 31..50 are identical to the uninterrupted run of its own
graph setting and within 1e-3 of the other one; ``parallel_state`` never initialised; every run exits within 60 s
of the end of training; graphed steps are faster than graphs-off ones (median step time, recorded).
About three minutes on an H200 (mostly process start-up and Bridge's set-up); at most about nine if every run
times out.

Issue #35, the ``moe`` tests (``-k moe``, their own runs): the MoE tiny Qwen3-VL on the photo set through Bridge's
data path (``recipes/tiny_qwen3_vl_moe_photos.yaml``: packed in Bridge's step since the packed MoE graphs;
language graphs of each MoE layer's attention, its MLP half eager, vision graphs, ``dist.use_decentralized_pg=true``),
30 iterations graphs on and twice graphs off,
and graphs on resumed at 20: every run trains, logs its MoE metrics, evaluates and saves under pure M4; graphs
captured and replayed, none failed; every loss and grad norm finite, graphs on equal to graphs off (within twice the
eager-vs-eager floor where the two eager runs differ), the resumed run likewise against the uninterrupted one. At
most about eight minutes.
"""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).with_name("_bridge_runner.py")
ITERS, SAVE_AT, RESUME_WARMUP = 50, 30, 3
EVAL_AT = (20, 40)
LOSS_BOUND = 1e-3  # DESIGN.md's parity bound; identical is expected
EXIT_BOUND_S = 60.0
# Per run (about a minute each is expected); together (200 + 150 + 180, the three resumed runs in parallel) below
# the device machine's 10-minute command limit, so a hang fails these tests with its log instead of losing the
# whole session. The first run also pays cold imports and Megatron's dataset-helper compile.
FIRST_RUN_TIMEOUT_S, RUN_TIMEOUT_S, PARALLEL_TIMEOUT_S = 200, 150, 180
#: name -> (graph setting, the uninterrupted run whose checkpoint at SAVE_AT it loads, whether it saves)
RESUMED = {
    "resumed": ("on", "graphs_on", True),
    "resumed_off_from_on": ("off", "graphs_on", False),
    "resumed_on_from_off": ("on", "graphs_off", False),
}

#: Bridge's own default, which the recipe turns off; without APEX only this plugin's provider builds it
#: (bridge_cudagraph.host.wgrad_fusion: TE's layers sum their weight gradients into main_grad in their GEMMs).
FUSION_ON = ("--override", "model.gradient_accumulation_fusion=true")
FUSED = {"fused_on": "on", "fused_off": "off"}


@dataclass
class Run:
    """One runner process and what it wrote."""

    name: str
    returncode: int | str
    data: dict
    log: Path
    exited_at: float
    checkpoint: Path | None
    steps: dict[int, dict] = field(init=False)

    def __post_init__(self):
        self.steps = {s["iteration"]: s for s in self.data.get("steps", [])}

    def tail(self, chars: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else "(no log)"

    def require_ok(self) -> None:
        assert self.returncode == 0, f"{self.name} exited with {self.returncode}; log tail:\n{self.tail()}"

    def losses(self) -> dict[int, float]:
        return {i: s["loss"] for i, s in self.steps.items()}

    def capture(self, submodule: str) -> dict | None:
        return self.data.get("capture", {}).get(submodule)


@dataclass
class _Started:
    name: str
    proc: subprocess.Popen
    out: Path
    log: Path
    checkpoint: Path | None
    timeout: int
    started: float


def _start(
    tmp: Path, name: str, *args: str, save: bool = True, timeout: int = RUN_TIMEOUT_S, iters: int = ITERS
) -> _Started:
    out, log = tmp / f"{name}.json", tmp / f"{name}.log"
    checkpoint = tmp / f"ckpt_{name}" if save else None
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", str(RUNNER)]
    cmd += ["--out", str(out), "--iters", str(iters), *args]
    if checkpoint is not None:
        cmd += ["--save", str(checkpoint)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    with open(log, "w") as sink:
        # Its own session, so a timeout can stop torchrun (and, by its recorded pid, the worker torchrun starts in a
        # session of its own).
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
    return _Started(name, proc, out, log, checkpoint, timeout, time.monotonic())


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # not written yet (the runner replaces it atomically)
        return {}


def _kill(proc: subprocess.Popen, worker_pid: int | None) -> None:
    """SIGKILL torchrun's session and the worker's (torchrun starts its workers with ``start_new_session``)."""
    for pgid in (proc.pid, worker_pid):
        if pgid:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    proc.wait()


def _finish_all(started: list[_Started]) -> dict[str, Run]:
    """Wait for every started run at once (each against its own deadline), noting each one's exit as it happens."""
    exits: dict[str, tuple[int | str, float]] = {}
    while len(exits) < len(started):
        for run in started:
            if run.name in exits:
                continue
            returncode = run.proc.poll()
            if returncode is None and time.monotonic() - run.started > run.timeout:
                _kill(run.proc, _read_json(run.out).get("pid"))
                returncode = f"timeout after {run.timeout} s"
            if returncode is not None:
                exits[run.name] = (returncode, time.time())
        time.sleep(0.2)
    return {
        s.name: Run(s.name, exits[s.name][0], _read_json(s.out), s.log, exits[s.name][1], s.checkpoint)
        for s in started
    }


def _launch(
    tmp: Path, name: str, *args: str, save: bool = True, timeout: int = RUN_TIMEOUT_S, iters: int = ITERS
) -> Run:
    return _finish_all([_start(tmp, name, *args, save=save, timeout=timeout, iters=iters)])[name]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    tmp = tmp_path_factory.mktemp("bridge_loop")
    # One at a time: their step times are compared.
    on = _launch(tmp, "graphs_on", "--graphs", "on", "--save-interval", str(SAVE_AT), timeout=FIRST_RUN_TIMEOUT_S)
    off = _launch(tmp, "graphs_off", "--graphs", "off", "--save-interval", str(SAVE_AT))
    sources = {"graphs_on": on, "graphs_off": off}
    started = []
    for name, (graphs, source, save) in RESUMED.items():
        if (sources[source].checkpoint / f"iter_{SAVE_AT:07d}").is_dir():
            load = ["--load", str(sources[source].checkpoint), "--ckpt-step", str(SAVE_AT)]
            started.append(_start(tmp, name, "--graphs", graphs, *load, save=save, timeout=PARALLEL_TIMEOUT_S))
    for name, graphs in FUSED.items():  # not timed either: they only compare losses
        fused = ["--graphs", graphs, *FUSION_ON]
        started.append(_start(tmp, name, *fused, save=False, timeout=PARALLEL_TIMEOUT_S))
    finished = _finish_all(started)  # the deadlines run concurrently: at most PARALLEL_TIMEOUT_S
    return SimpleNamespace(on=on, off=off, **{name: finished.get(name) for name in (*RESUMED, *FUSED)})


def _require_resumed(runs, name: str = "resumed") -> Run:
    run = getattr(runs, name)
    source = runs.on if RESUMED[name][1] == "graphs_on" else runs.off
    assert run is not None, f"{source.name} saved no checkpoint at {SAVE_AT}; log tail:\n{source.tail()}"
    run.require_ok()
    return run


def _compare(a: dict[int, float], b: dict[int, float], name: str):
    """Per-iteration losses compared NaN-safely (``parity.compare_series``): the same iterations, finite."""
    from bridge_cudagraph.testing.parity import compare_series

    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    keys = sorted(a)
    return compare_series([a[k] for k in keys], [b[k] for k in keys], name=name)


def _checkpoint_keys(directory: Path) -> dict[str, list[str]]:
    """Keys of a torch_dist checkpoint: the sharded ones (``.metadata``) and the common ones, read as megatron-core
    reads them (``load_common_state_dict``: since 0.19 one ``common_state`` object inside the torch_dist files, a
    ``common.pt`` beside them only in older checkpoints).

    A common state this process cannot read fails here, naming the folder and the error. (Unreadable files once
    became the same placeholder on both sides of a comparison, so two broken checkpoints compared equal.)"""
    from megatron.core.dist_checkpointing.serialization import load_common_state_dict
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception

    keys = {"sharded": sorted(FileSystemReader(str(directory)).read_metadata().state_dict_metadata)}
    try:
        common = load_common_state_dict(str(directory))
    except (Exception, CheckpointException) as error:
        raise AssertionError(f"{directory}: common state unreadable: {type(error).__name__}: {error}") from error
    assert isinstance(common, dict) and common, f"{directory}: no common state ({common!r:.200})"
    keys["common"] = sorted(common)
    return keys


def _median_step_seconds(run: Run, first: int) -> float:
    return statistics.median(s["seconds"] for i, s in run.steps.items() if i >= first)


# --------------------------------------------------------------------------------------------------- tests
def test_runs_complete(runs, record):
    for run in (runs.on, runs.off):
        run.require_ok()
        assert sorted(run.steps) == list(range(1, ITERS + 1)), run.name
        assert all(s["loss"] is not None and s["loss"] == s["loss"] for s in run.steps.values()), run.name
    resumed = [_require_resumed(runs, name) for name in RESUMED]
    for run in resumed:
        assert run.data["start_step"] == SAVE_AT, run.name
        assert sorted(run.steps) == list(range(SAVE_AT + 1, ITERS + 1)), run.name
    record(
        **{f"{r.name}_wall_s": round(r.exited_at - r.data["launch_time"], 1) for r in (runs.on, runs.off, *resumed)}
    )


def test_callback_captured_after_warmup_and_again_after_resume(runs, record):
    from bridge_cudagraph.testing.parity import assert_captured

    runs.on.require_ok()
    assert runs.on.data["bridge_helper_name_installed"]
    assert runs.on.data["model_cuda_graph_impl"] == "transformer_engine"  # the layers route to TE graphs
    language = runs.on.capture("language")
    assert language is not None, runs.on.data["graphs"]
    assert language["failure"] is None and language["phase"] == "captured", language
    assert language["captured_at"] == language["warmup"] == 3
    # One micro-batch per step, one graph per run of layers (the plan's default unit): the tiny model's 4 layers run
    # as layers 0, 1 and 2-3, since a deepstack merge follows layers 0 and 1.
    assert (language["graphs"], language["layers"]) == (3, 4)
    assert language["manual_hooks"]  # overlap_param_gather: the replayed layers wait for their param gather
    vision = runs.on.capture("vision")
    assert vision is not None, runs.on.data["graphs"]  # the tiny recipe enables vision graphs
    assert vision["failure"] is None and vision["phase"] == "captured", vision
    assert vision["captured_at"] == vision["warmup"]
    final = {g["submodule"]: g for g in runs.on.data["graphs"]}  # after the end-of-training teardown
    assert all(g["phase"] == "deleted" for g in final.values() if g["captured_at"] is not None)
    assert final["language"]["graphed_steps"] == ITERS - language["captured_at"]
    # every training micro-batch (1 per step, 1-3 images per sample) replayed
    assert final["vision"]["eager_fallbacks"] == 0, final["vision"]
    # The vision ladder's parameter gradients summed by graphs (capture.param_grads), under the recipe's overlapped
    # gradient reduce (DDP's check of a None gradient passes through megatron-core's _cudagraph_wgrad_ready_event).
    assert vision["param_grads_summed"] > 0, vision
    assert final["vision"]["replays"] == final["vision"]["graphed_steps"] == ITERS - vision["captured_at"]
    for sub in ("language", "vision"):  # graphs counted at capture (the teardown resets them), replays at the end
        assert_captured({**final[sub], "graphs": runs.on.capture(sub)["graphs"]}, where=f"graphs_on {sub}")
    assert runs.off.data["graphs"] == [] and runs.off.data["model_cuda_graph_impl"] == "none"
    for name in ("resumed", "resumed_on_from_off"):  # graphs on after a resume: captured again, warmup steps later
        resumed = _require_resumed(runs, name)
        again = resumed.capture("language")
        assert again is not None, (name, resumed.data["graphs"])
        assert again["phase"] == "captured" and again["failure"] is None, (name, again)
        assert again["captured_at"] == SAVE_AT + RESUME_WARMUP, (name, again)
        if resumed.capture("vision") is not None:
            assert resumed.capture("vision")["captured_at"] == SAVE_AT + resumed.capture("vision")["warmup"], name
        ended = {g["submodule"]: g for g in resumed.data["graphs"]}
        assert all(g["phase"] == "deleted" for g in ended.values() if g["captured_at"] is not None), (name, ended)
        assert ended["language"]["graphed_steps"] == ITERS - again["captured_at"], (name, ended)
        for sub in ended:
            assert_captured({**ended[sub], "graphs": resumed.capture(sub)["graphs"]}, where=f"{name} {sub}")
    cold = _require_resumed(runs, "resumed_off_from_on")  # graphs off, from a checkpoint taken with graphs on
    assert cold.data["graphs"] == [] and cold.data["model_cuda_graph_impl"] == "none", cold.data["graphs"]
    at_capture = ("graphs", "layers", "seconds", "graph_memory_bytes")
    at_end = ("graphed_steps", "replays", "eager_fallbacks")
    record(
        **{f"{sub}_{key}": (runs.on.capture(sub) or {}).get(key) for sub in final for key in at_capture},
        **{f"{sub}_{key}": final[sub][key] for sub in final for key in at_end},
    )


def test_the_cached_walks_step_every_graphed_run(runs, record):
    """The callback puts the optimizer's and the finalisation's walks done once on where graphs are (the plan's
    defaults of ``model.cuda_graph.cached_walks``) and every step takes them; graphs off leave megatron-core's step
    as it is. The losses test below is then their parity against Bridge's graphs-off loop too."""
    runs.on.require_ok()
    runs.off.require_ok()
    assert runs.on.data["optimizer_walks_cached"] and not runs.off.data["optimizer_walks_cached"]
    # The finalisation's module walk is listed too (cached_walks.grad_finalize), at every step.
    assert runs.on.data["finalize_listed"] and not runs.off.data["finalize_listed"]
    counts = runs.on.data["optimizer_cached_steps"]
    # Adam's first step is the host's (it creates the state); every gradient view and parameter copy is cached.
    # The chained step's first is the host's too (its members' views do not exist yet).
    assert counts == {"distributed_optimizer": ITERS, "adam": ITERS - 1, "chained": ITERS - 1}, counts
    assert runs.off.data["optimizer_cached_steps"] == {"distributed_optimizer": 0, "adam": 0, "chained": 0}
    resumed = _require_resumed(runs, "resumed")
    after = resumed.data["optimizer_cached_steps"]
    assert after["distributed_optimizer"] == ITERS - SAVE_AT and after["adam"] >= ITERS - SAVE_AT - 1, after
    assert after["chained"] == ITERS - SAVE_AT - 1, after
    record(graphs_on=counts, resumed=after)


def test_the_forward_parts_in_every_graphed_run(runs, record):
    """The callback puts every part of ``model.cuda_graph.forward`` on where graphs are (the plan's default): every
    training micro-batch of the graphed runs took the positions from the host copy, those with images the
    image-token merge by rows; none went to Bridge's forward flat (the recipe's rows are padded, not packed); graphs
    off took none of them; every forward of the graphed runs bound the grids Bridge's loop drew on the host, and no
    replaying encoder read its grid back. The losses tests are then its parity against Bridge's graphs-off loop
    too."""
    for name in ("on", "fused_on"):
        run = getattr(runs, name)
        run.require_ok()
        assert run.data["forward_installed"], name
        assert run.data["cpu_positions_calls"] >= ITERS, (name, run.data["cpu_positions_calls"])
        # Every sample of the tiny recipe holds an image: every forward merges by rows.
        assert run.data["row_merges"] == run.data["cpu_positions_calls"], (name, run.data["row_merges"])
        # The tiny recipe pads every row to seq_length and packs nothing (BSHD): no rows for Bridge's forward to
        # pack, so none handed flat (the photo recipe's packed rows are: tests/gpu/test_packed_language.py).
        assert run.data["flat_batches"] == 0, (name, run.data["flat_batches"])
        # The collated batch's grids, in the loop's forward step's micro-batch (vision.cpu_grids): every forward bound
        # its grid, and no replaying encoder read one back from the GPU.
        assert run.data["grid_binds"] == run.data["cpu_positions_calls"], (name, run.data["grid_binds"])
        assert run.data["grids_read_back"] == 0, (name, run.data["grids_read_back"])
    runs.off.require_ok()
    assert not runs.off.data["forward_installed"] and runs.off.data["cpu_positions_calls"] == 0
    assert runs.off.data["row_merges"] == runs.off.data["flat_batches"] == runs.off.data["grid_binds"] == 0
    record(
        graphs_on=runs.on.data["cpu_positions_calls"],
        fused_on=runs.fused_on.data["cpu_positions_calls"],
        row_merges_on=runs.on.data["row_merges"],
        row_merges_fused_on=runs.fused_on.data["row_merges"],
        flat_batches_on=runs.on.data["flat_batches"],
        grid_binds_on=runs.on.data["grid_binds"],
        grids_read_back_on=runs.on.data["grids_read_back"],
    )


def test_both_runs_start_from_the_same_weights(runs):
    # Otherwise a loss difference below would come from the model build, not from the graphs.
    for run in (runs.on, runs.off):
        assert "weights_at_start" in run.data, f"{run.name} never started training; log tail:\n{run.tail()}"
    on, off = runs.on.data["weights_at_start"], runs.off.data["weights_at_start"]
    assert on["names"] == off["names"]
    assert on["checksum"] == off["checksum"], (on["checksum"], off["checksum"])


def test_losses_match_graphs_off_at_every_iteration(runs, record):
    runs.on.require_ok()
    runs.off.require_ok()
    on, off = runs.on.losses(), runs.off.losses()
    d = _compare(on, off, "loss, graphs on vs off")
    record(
        loss_max_abs_diff=d.max_abs,
        identical_iterations=d.exact_steps,
        iterations=d.steps,
        nonfinite_steps=list(d.nonfinite_steps),
        first=on[1],
        last=on[ITERS],
    )
    d.require_identical()  # README: "losses identical to graphs-off at every iteration"


def test_fused_weight_gradients_match_graphs_off_at_every_iteration(runs, record):
    """``model.gradient_accumulation_fusion=true`` on this stack (no APEX needed: TE's layers fuse): the language
    model's TE modules sum their weight gradients into ``main_grad`` (counted in the model Bridge built), DDP's hook
    skips their placeholders (the marks), the graphs capture and replay, and the loss equals graphs-off's fused loss at
    every iteration. Against the unfused runs the loss moves only by the fused sum's rounding (recorded)."""
    from bridge_cudagraph.testing.parity import assert_captured

    runs.off.require_ok()
    fused_on, fused_off = runs.fused_on, runs.fused_off
    for run in (fused_on, fused_off):
        run.require_ok()
        assert sorted(run.steps) == list(range(1, ITERS + 1)), run.name
    fusing = fused_on.data["te_modules_fusing_wgrad"]
    assert fusing > 0 and fused_off.data["te_modules_fusing_wgrad"] == fusing, (fusing, fused_off.data)
    assert runs.on.data["te_modules_fusing_wgrad"] == 0  # the recipe's own setting: off
    assert fused_on.data["params_marked_added_to_main_grad"] >= fusing, fused_on.data
    final = {g["submodule"]: g for g in fused_on.data["graphs"]}
    for sub in ("language", "vision"):
        captured = fused_on.capture(sub)
        assert captured is not None and captured["failure"] is None, (sub, fused_on.data["graphs"])
        assert_captured({**final[sub], "graphs": captured["graphs"]}, where=f"fused_on {sub}")
    d = _compare(fused_on.losses(), fused_off.losses(), "loss, fused, graphs on vs off")
    rounding = _compare(fused_off.losses(), runs.off.losses(), "loss, fused vs unfused, graphs off")
    record(
        te_modules_fusing=fusing,
        marked=fused_on.data["params_marked_added_to_main_grad"],
        loss_max_abs_diff=d.max_abs,
        identical_iterations=d.exact_steps,
        vs_unfused_max_abs=rounding.max_abs,
        vs_unfused_identical_iterations=rounding.exact_steps,
    )
    d.require_identical()
    assert not rounding.nonfinite_steps and rounding.max_abs < 0.05, rounding


def test_evaluation_mid_training_is_eager_and_matches(runs, record):
    runs.on.require_ok()
    runs.off.require_ok()

    def mid(run):
        return {e["iteration"]: e for e in run.data["evals"] if e["iteration"] in EVAL_AT}

    on, off = mid(runs.on), mid(runs.off)
    assert sorted(on) == sorted(off) == list(EVAL_AT), (runs.on.data["evals"], runs.off.data["evals"])
    for it in EVAL_AT:
        assert on[it]["training_mode_during_eval"] == [False] * len(on[it]["training_mode_during_eval"])
        assert "captured" in on[it]["graph_phases"]  # graphs alive, not replayed (eval mode), kept for training
        assert on[it]["losses"].keys() == off[it]["losses"].keys() and on[it]["losses"]
        for key, value in on[it]["losses"].items():
            assert abs(value - off[it]["losses"][key]) <= LOSS_BOUND, (it, key, value, off[it]["losses"][key])
    record(eval_losses_on={it: on[it]["losses"] for it in EVAL_AT})


def test_checkpoint_keys_do_not_change_with_graphs(runs, record):
    runs.on.require_ok()
    runs.off.require_ok()
    final = f"iter_{ITERS:07d}"
    on, off = _checkpoint_keys(runs.on.checkpoint / final), _checkpoint_keys(runs.off.checkpoint / final)
    for kind in on.keys() | off.keys():
        extra, missing = set(on.get(kind, [])) - set(off.get(kind, [])), set(off.get(kind, [])) - set(on.get(kind, []))
        assert not extra and not missing, (
            f"{kind}: only with graphs {sorted(extra)[:10]}, only without {sorted(missing)[:10]}"
        )
    assert _checkpoint_keys(runs.on.checkpoint / f"iter_{SAVE_AT:07d}") == on
    resumed = _require_resumed(runs)
    assert _checkpoint_keys(resumed.checkpoint / final) == on
    record(sharded_keys=len(on["sharded"]), common_keys=len(on.get("common", [])))


@pytest.mark.parametrize("name", list(RESUMED))
def test_resumed_run_matches_the_uninterrupted_ones(runs, record, name):
    """Losses at 31..50 of a resumed run against both uninterrupted runs: the one of its own graph setting (like for
    like: only the checkpoint's origin differs) and the other one (graphs on and off agree within 1e-3 anyway)."""
    resumed = _require_resumed(runs, name)
    runs.on.require_ok()
    runs.off.require_ok()
    graphs, source, _ = RESUMED[name]
    diffs = {}
    for reference in (runs.on, runs.off):
        tail = {i: loss for i, loss in reference.losses().items() if i > SAVE_AT}
        diffs[reference.name] = _compare(resumed.losses(), tail, f"{name} vs {reference.name}")
    same = "graphs_on" if graphs == "on" else "graphs_off"
    record(
        resumed_graphs=graphs,
        checkpoint_from=source,
        loss_max_abs_diff_vs_graphs_on=diffs["graphs_on"].max_abs,
        loss_max_abs_diff_vs_graphs_off=diffs["graphs_off"].max_abs,
        loss_max_abs_diff_vs_same_setting=diffs[same].max_abs,
        identical_iterations_vs_same_setting=diffs[same].exact_steps,
    )
    # README: "all identical to the uninterrupted runs"; the other setting within the bound, finite either way.
    diffs[same].require_identical()
    for d in diffs.values():
        d.require_within(LOSS_BOUND)


def test_parallel_state_is_never_initialised(runs):
    for run in (runs.on, runs.off):
        run.require_ok()
        assert run.data["parallel_state_untouched_at_start"] and run.data["parallel_state_untouched_at_end"], run.name


def test_every_run_exits_promptly(runs, record):
    resumed = [_require_resumed(runs, name) for name in RESUMED]
    exits = {}
    for run in (runs.on, runs.off, *resumed):
        run.require_ok()
        exits[run.name] = run.exited_at - run.data["train_end_time"]
    record(**{f"{name}_exit_s": round(s, 1) for name, s in exits.items()})
    slow = {name: s for name, s in exits.items() if s > EXIT_BOUND_S}
    assert not slow, f"exit took longer than {EXIT_BOUND_S} s after training ended: {slow}"


def test_graphed_steps_are_faster(runs, record):
    """The README's speed-up in Bridge's own loop (1.26x in run 12, 1.52x in run 6): graphed steps must be faster."""
    runs.on.require_ok()
    runs.off.require_ok()
    first = runs.on.capture("language")["captured_at"] + 3  # steady state, a few steps after capture
    on_s, off_s = _median_step_seconds(runs.on, first), _median_step_seconds(runs.off, first)
    record(step_ms_graphs_on=1e3 * on_s, step_ms_graphs_off=1e3 * off_s, step_time_ratio_off_over_on=off_s / on_s)
    assert 0 < on_s < off_s, (on_s, off_s)


# ---------------------------------------------------------------------- issue #35: the MoE Qwen3-VL under pure M4
MOE_RECIPE = ROOT / "recipes" / "tiny_qwen3_vl_moe_photos.yaml"
MOE_ITERS, MOE_SAVE_AT, MOE_EVAL_AT = 30, 20, (10, 20)
#: The first run builds the photo set and its processor (the cache the others read) and pays the cold imports; the
#: other three run at once. Together below the device machine's 10-minute command limit.
MOE_FIRST_TIMEOUT_S, MOE_PARALLEL_TIMEOUT_S = 240, 210


def _moe_deterministic() -> tuple[str, ...]:
    """Under ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0`` the MoE runs also switch on Bridge's own deterministic mode
    (``model.deterministic_mode``: torch's deterministic algorithms, under which megatron-core's token unpermute
    and routing map use ``index_add_``/``index_put_`` instead of atomic scatters; Bridge demands the unfused cross
    entropy and an ``NCCL_ALGO``). Eager then repeats itself bit for bit, and the graphed run must equal it: the
    proof that the graphs change nothing. Otherwise the MoE token scatter is atomic and a flipped expert choice
    grows over the steps, so graphs are held to a multiple of the eager-vs-eager floor."""
    if os.environ.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO") != "0":
        return ()
    os.environ.setdefault("NCCL_ALGO", "Ring")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return ("--override", "model.deterministic_mode=true", "--override", "model.cross_entropy_loss_fusion=false")


@pytest.fixture(scope="module")
def moe_runs(tmp_path_factory):
    """``recipes/tiny_qwen3_vl_moe_photos.yaml`` (the MoE tiny Qwen3-VL on the photo set through Bridge's data path,
    packed rows, ``dist.use_decentralized_pg=true``) for ``MOE_ITERS`` iterations: graphs on (language
    ``[attn]`` per MoE layer and vision; saved at ``MOE_SAVE_AT`` and at the end), then at once graphs
    off (saved likewise), graphs off again (the eager-vs-eager floor) and graphs on resumed from the first run's
    checkpoint at ``MOE_SAVE_AT``."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    tmp = tmp_path_factory.mktemp("bridge_loop_moe")
    common = ("--recipe", str(MOE_RECIPE), *_moe_deterministic())
    saves = ("--save-interval", str(MOE_SAVE_AT))
    on = _launch(tmp, "moe_graphs_on", *common, "--graphs", "on", *saves, timeout=MOE_FIRST_TIMEOUT_S, iters=MOE_ITERS)
    later = {"timeout": MOE_PARALLEL_TIMEOUT_S, "iters": MOE_ITERS}
    started = [
        _start(tmp, "moe_graphs_off", *common, "--graphs", "off", *saves, **later),
        _start(tmp, "moe_graphs_off_again", *common, "--graphs", "off", save=False, **later),
    ]
    if (on.checkpoint / f"iter_{MOE_SAVE_AT:07d}").is_dir():
        load = ("--load", str(on.checkpoint), "--ckpt-step", str(MOE_SAVE_AT))
        started.append(_start(tmp, "moe_resumed", *common, "--graphs", "on", *load, save=False, **later))
    if _moe_deterministic():
        language_only = ("--graphs", "on", "--override", "model.cuda_graph.vision.enabled=false")
        started.append(_start(tmp, "moe_language_only", *common, *language_only, save=False, **later))
    finished = _finish_all(started)
    return SimpleNamespace(
        on=on,
        off=finished["moe_graphs_off"],
        off_again=finished["moe_graphs_off_again"],
        resumed=finished.get("moe_resumed"),
        language_only=finished.get("moe_language_only"),
    )


MOE_PADDED_ITERS = 12


@pytest.fixture(scope="module")
def padded_moe_runs(tmp_path_factory):
    """The MoE recipe on padded rows for ``MOE_PADDED_ITERS`` iterations, three at once: language graphs on (vision
    off, so the language graphs alone are compared; ``modules: null``, each MoE layer's attention a graph on the padded
    ladder and its MLP half eager), graphs off, and graphs off again (the eager-vs-eager floor)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from tests.unit.test_bad_configs import PADDED_ROWS  # the MoE recipe's rows padded to seq_length, not packed

    tmp = tmp_path_factory.mktemp("bridge_loop_padded_moe")
    rows = [arg for o in PADDED_ROWS for arg in ("--override", o)]
    common = ("--recipe", str(MOE_RECIPE), *_moe_deterministic(), *rows)
    each = {"timeout": MOE_FIRST_TIMEOUT_S, "iters": MOE_PADDED_ITERS, "save": False}
    language_only = ("--override", "model.cuda_graph.vision.enabled=false")
    return _finish_all(
        [
            _start(tmp, "padded_moe_on", *common, "--graphs", "on", *language_only, **each),
            _start(tmp, "padded_moe_off", *common, "--graphs", "off", **each),
            _start(tmp, "padded_moe_off_again", *common, "--graphs", "off", **each),
        ]
    )


def test_padded_moe_language_graphs_replay_on_the_ladder_and_match_graphs_off(padded_moe_runs, record):
    """Bridge's loop on the MoE recipe's padded rows, language graphs from ``modules: null``: captured on the ladder
    (``PaddedLanguageGraphHelper``, one graph per MoE layer's attention), replayed at every graphed step without a
    fallback, and every iteration's loss and grad norm equal graphs off bit for bit where eager equals itself
    (deterministic mode), else within ``parity.FLOOR_FACTOR`` times eager's own difference."""
    from bridge_cudagraph.testing.parity import assert_captured

    on, off, off_again = (padded_moe_runs[n] for n in ("padded_moe_on", "padded_moe_off", "padded_moe_off_again"))
    for run in (on, off, off_again):
        run.require_ok()
        assert sorted(run.steps) == list(range(1, MOE_PADDED_ITERS + 1)), run.name
    captured = on.capture("language")
    assert captured is not None and captured["failure"] is None, on.data["graphs"]
    assert captured["helper"] == "PaddedLanguageGraphHelper", captured
    ended = {g["submodule"]: g for g in on.data["graphs"]}
    assert set(ended) == {"language"}, sorted(ended)
    assert_captured({**ended["language"], "graphs": captured["graphs"]}, where="padded_moe_on")
    assert ended["language"]["eager_fallbacks"] == 0, ended
    assert ended["language"]["graphed_steps"] == MOE_PADDED_ITERS - captured["captured_at"], ended
    out = {}
    for key in ("loss", "grad_norm"):
        floor = _compare(_series(off_again, key), _series(off, key), f"padded moe {key}, eager vs eager")
        assert floor.finite, floor.describe()
        if _moe_deterministic():
            floor.require_identical()
        d = _match_within_floor(on, off, floor, key, f"padded moe {key}, language graphs vs off")
        out[key] = {**d.as_dict(), "floor": floor.as_dict()}
    record(graphs=captured["graphs"], replays=ended["language"]["replays"], **out)


def _series(run: Run, key: str) -> dict[int, float | None]:
    return {i: s[key] for i, s in run.steps.items()}


def _match_within_floor(got: Run, reference: Run, floor, key: str, name: str):
    """``got`` against ``reference`` over ``got``'s iterations: identical where the eager-vs-eager ``floor`` (a
    ``SeriesDiff``) is, else within ``parity.FLOOR_FACTOR`` times it (vision attention backward and the MoE token
    scatter need not be bitwise deterministic; the graphed difference is one more draw of that noise). Finite at
    every step either way."""
    from bridge_cudagraph.testing.parity import FLOOR_FACTOR

    mine = _series(got, key)
    d = _compare(mine, {i: v for i, v in _series(reference, key).items() if i in mine}, name)
    if floor.identical:
        d.require_identical()
    else:
        d.require_within(FLOOR_FACTOR * floor.max_abs)
    return d


def _moe_floor(moe_runs, key: str):
    d = _compare(_series(moe_runs.off_again, key), _series(moe_runs.off, key), f"moe {key}, eager vs eager")
    assert d.finite, d.describe()
    return d


def test_moe_pure_m4_trains_logs_evaluates_and_saves(moe_runs, record):
    """Bridge's loop runs the MoE Qwen3-VL under pure M4 to the end, graphs on and off: the MoE metrics are logged at
    every iteration (the log interval is 1; issue #35 died at the first), every loss and grad norm is finite, the
    evaluations run, the checkpoints are written with the same keys, and ``parallel_state`` is never initialised."""
    for run in (moe_runs.on, moe_runs.off, moe_runs.off_again):
        run.require_ok()
        assert sorted(run.steps) == list(range(1, MOE_ITERS + 1)), run.name
        for key in ("loss", "grad_norm"):
            values = list(_series(run, key).values())
            assert all(v is not None and math.isfinite(v) for v in values), (run.name, key, values)
        assert run.data["parallel_state_untouched_at_start"] and run.data["parallel_state_untouched_at_end"], run.name
        evals = {e["iteration"]: e for e in run.data["evals"]}
        assert set(MOE_EVAL_AT) <= set(evals), (run.name, sorted(evals))
        for it in MOE_EVAL_AT:
            losses = evals[it]["losses"]
            assert losses and all(math.isfinite(v) for v in losses.values()), (run.name, it, losses)
    for run in (moe_runs.on, moe_runs.off):
        for step in (MOE_SAVE_AT, MOE_ITERS):
            assert (run.checkpoint / f"iter_{step:07d}").is_dir(), (run.name, step, run.tail())
    on_keys = _checkpoint_keys(moe_runs.on.checkpoint / f"iter_{MOE_ITERS:07d}")
    off_keys = _checkpoint_keys(moe_runs.off.checkpoint / f"iter_{MOE_ITERS:07d}")
    assert on_keys == off_keys, {k: sorted(set(on_keys[k]) ^ set(off_keys.get(k, []))) for k in on_keys}
    record(
        sharded_keys=len(on_keys["sharded"]),
        common_keys=len(on_keys["common"]),
        **{f"{r.name}_wall_s": round(r.exited_at - r.data["launch_time"], 1) for r in (moe_runs.on, moe_runs.off)},
        evals_on={e["iteration"]: e["losses"] for e in moe_runs.on.data["evals"]},
    )


def test_moe_pure_m4_graphs_captured_and_replayed(moe_runs, record):
    from bridge_cudagraph.testing.parity import assert_captured

    on = moe_runs.on
    on.require_ok()
    assert on.data["model_cuda_graph_impl"] == "transformer_engine"
    final = {g["submodule"]: g for g in on.data["graphs"]}  # after the end-of-training teardown
    for sub in ("language", "vision"):
        captured = on.capture(sub)
        assert captured is not None, (sub, on.data["graphs"])
        assert captured["failure"] is None and captured["phase"] == "captured", (sub, captured)
        assert captured["captured_at"] == captured["warmup"], (sub, captured)
        assert_captured({**final[sub], "graphs": captured["graphs"]}, where=f"moe_graphs_on {sub}")
        assert final[sub]["phase"] == "deleted", (sub, final[sub])
    assert final["language"]["graphed_steps"] == MOE_ITERS - on.capture("language")["captured_at"], final
    for run in (moe_runs.off, moe_runs.off_again):
        run.require_ok()
        assert run.data["graphs"] == [] and run.data["model_cuda_graph_impl"] == "none", run.name
    record(
        **{f"{sub}_{k}": (on.capture(sub) or {}).get(k) for sub in final for k in ("graphs", "layers", "seconds")},
        **{f"{sub}_{k}": final[sub][k] for sub in final for k in ("graphed_steps", "replays", "eager_fallbacks")},
    )


#: Under deterministic mode the MoE runs with vision graphs leave eager's numbers (from the photo set's tenth iteration
#: on in results/vision-padding/run64), whatever the language scope, while the language graphs alone stay bit-exact.
#: The cause is the padding to a static budget, not the graphs: ``tests/gpu/test_vision_padding.py`` replays this run's
#: own 4096-budget micro-batches and finds the graphs bit for bit the same layers run eagerly on the padded rows, while
#: the padded rows change cuBLAS's weight-gradient reduction against the unpadded ones
#: (results/vision-padding/README.md). Strict: the day padding stops changing those sums, these tests say so.
_VISION_GAP_UNDER_DETERMINISM = pytest.mark.xfail(
    os.environ.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO") == "0",
    reason="vision graphs pad patches to a static budget, which changes cuBLAS's weight-gradient sums against "
    "unpadded eager (tests/gpu/test_vision_padding.py); the language graphs are exact",
    raises=AssertionError,
    strict=True,
)


def test_moe_language_graphs_are_bit_exact_under_deterministic_mode(moe_runs, record):
    """Bridge's deterministic mode, graphs on the language model alone ([attn] per MoE layer): every
    iteration's loss and grad norm equal graphs off bit for bit, and eager equals itself (the mode holds)."""
    if moe_runs.language_only is None:
        pytest.skip("needs NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 (the MoE runs then use Bridge's deterministic mode)")
    from bridge_cudagraph.testing.parity import assert_captured

    run = moe_runs.language_only
    for r in (run, moe_runs.off, moe_runs.off_again):
        r.require_ok()
    captured = run.capture("language")
    assert captured is not None and captured["failure"] is None, run.data["graphs"]
    ended = {g["submodule"]: g for g in run.data["graphs"]}
    assert set(ended) == {"language"}, sorted(ended)
    assert_captured({**ended["language"], "graphs": captured["graphs"]}, where="moe_language_only")
    out = {}
    for key in ("loss", "grad_norm"):
        _moe_floor(moe_runs, key).require_identical()
        d = _compare(_series(run, key), _series(moe_runs.off, key), f"moe {key}, language graphs vs off")
        d.require_identical()
        out[key] = d.as_dict()
    record(**out)


@_VISION_GAP_UNDER_DETERMINISM
def test_moe_pure_m4_losses_and_grad_norms_match_graphs_off(moe_runs, record):
    for run in (moe_runs.on, moe_runs.off, moe_runs.off_again):
        run.require_ok()
    for run in (moe_runs.on, moe_runs.off_again):  # else a difference would come from the build, not the graphs
        assert run.data["weights_at_start"]["checksum"] == moe_runs.off.data["weights_at_start"]["checksum"], run.name
    out = {}
    for key in ("loss", "grad_norm"):
        floor = _moe_floor(moe_runs, key)
        d = _match_within_floor(moe_runs.on, moe_runs.off, floor, key, f"moe {key}, graphs on vs off")
        out[key] = {"graphs_vs_eager": d.as_dict(), "eager_vs_eager": floor.as_dict()}
    on_s = statistics.median(s["seconds"] for i, s in moe_runs.on.steps.items() if i > 6)
    record(**out, step_ms_graphs_on_alone=1e3 * on_s)  # the off runs ran three at once: no speed comparison


@_VISION_GAP_UNDER_DETERMINISM
def test_moe_pure_m4_resumes_from_a_checkpoint(moe_runs, record):
    """Graphs on, resumed from the graphed run's checkpoint at ``MOE_SAVE_AT``: captured again after its warmup, and
    its losses and grad norms at ``MOE_SAVE_AT + 1 .. MOE_ITERS`` equal the uninterrupted run's (within the floor)."""
    from bridge_cudagraph.testing.parity import assert_captured

    moe_runs.on.require_ok()
    resumed = moe_runs.resumed
    assert resumed is not None, f"moe_graphs_on saved no checkpoint at {MOE_SAVE_AT}; log tail:\n{moe_runs.on.tail()}"
    resumed.require_ok()
    assert resumed.data["start_step"] == MOE_SAVE_AT
    assert sorted(resumed.steps) == list(range(MOE_SAVE_AT + 1, MOE_ITERS + 1))
    again = resumed.capture("language")
    assert again is not None and again["failure"] is None, resumed.data["graphs"]
    assert again["captured_at"] == MOE_SAVE_AT + RESUME_WARMUP, again
    ended = {g["submodule"]: g for g in resumed.data["graphs"]}
    for sub in ended:
        assert_captured({**ended[sub], "graphs": resumed.capture(sub)["graphs"]}, where=f"moe_resumed {sub}")
    assert resumed.data["parallel_state_untouched_at_start"] and resumed.data["parallel_state_untouched_at_end"]
    out = {}
    for key in ("loss", "grad_norm"):
        d = _match_within_floor(resumed, moe_runs.on, _moe_floor(moe_runs, key), key, f"moe {key}, resumed vs on")
        out[key] = d.as_dict()
    record(**out)
