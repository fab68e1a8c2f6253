"""benchmarks.real_loop: the end-of-training lines the product's throughput callback prints, read back; the runs'
order; a graphed run that did not replay or went non-finite is failed; and the whole runner on this machine, where
``train`` refuses (no GPU), records the refusal as a failed row, never a number."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from benchmarks import real_loop
from benchmarks.real_loop import Run, Variant, check_against_eager, parse_log, plan_runs, render_table, train_command
from benchmarks.tests.test_loop_logs import LINE

RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny_qwen3_vl_photos.yaml")


def _context(step: int):
    cfg = SimpleNamespace(logger=SimpleNamespace(log_interval=0), dataset=SimpleNamespace(num_workers=2))
    return SimpleNamespace(state=SimpleNamespace(train_state=SimpleNamespace(step=step), cfg=cfg))


def _printed_by_the_callback(capsys, wait_s: float) -> str:
    """What :class:`~bridge_cudagraph.bridge.throughput.ThroughputCallback` prints at the end of three measured steps
    whose batches take ``wait_s`` to draw, and the peak-memory line in its format."""
    from bridge_cudagraph.bridge.data_path import DataWait, observing_forward_step
    from bridge_cudagraph.bridge.throughput import ThroughputCallback, UsefulTokenMeter, format_peak_memory

    def batches():
        while True:
            time.sleep(wait_s)
            yield {"loss_mask": torch.ones(1, 8)}

    meter, wait = UsefulTokenMeter(), DataWait()
    step = observing_forward_step(lambda state, it, model: next(it), [meter.add], wait=wait)
    callback = ThroughputCallback(meter, skip_iterations=0, wait=wait)
    callback.on_train_start(_context(0))
    data = batches()
    for i in range(3):
        callback.on_train_step_start(_context(i))
        step(None, data, None)
        callback.on_train_step_end(_context(i))
    callback.on_train_end(_context(3))
    return capsys.readouterr().out + format_peak_memory(3 * 2**30, 5 * 2**30) + "\n"


def test_the_callbacks_end_of_training_lines_are_read_back(capsys):
    parsed = parse_log(_printed_by_the_callback(capsys, wait_s=0.03))
    assert parsed["measured_steps"] == 3 and parsed["useful_tokens_per_s"] > 0
    assert parsed["step_ms"] >= 30 and parsed["data_wait_ms"] >= 25 and parsed["data_wait_share"] > 0.5
    assert parsed["data_bound"] is True  # the callback's own advice line, above 10% of the step
    assert (parsed["peak_allocated_gib"], parsed["peak_reserved_gib"]) == (3.0, 5.0)
    assert "error" not in parsed


def test_a_refusal_is_read_as_the_error_and_no_numbers():
    parsed = parse_log("some output\nerror: train needs a CUDA GPU and this machine has none\n")
    assert parsed["error"].startswith("error: train needs a CUDA GPU") and "useful_tokens_per_s" not in parsed


def test_variants_alternate_and_their_commands_are_the_users():
    variants = [Variant(True, 2), Variant(False, 2)]
    assert [(v.name, r) for v, r in plan_runs(variants, 2)] == [
        ("graphs_w2", 0),
        ("eager_w2", 0),
        ("graphs_w2", 1),
        ("eager_w2", 1),
    ]
    command = train_command("r.yaml", 30, Variant(False, 4))
    assert command[1:] == [
        "-m",
        "bridge_cudagraph",
        "train",
        "r.yaml",
        "train.train_iters=30",
        *real_loop.GRAPHS_OFF,
        "dataset.num_workers=4",
    ]
    assert train_command("r.yaml", 30, Variant(True))[-1] == "train.train_iters=30"


def _log(path: Path, losses: list[str], summary: str | None) -> str:
    text = "\n".join(LINE.format(i=i + 1, loss=loss, norm="36.534") for i, loss in enumerate(losses))
    if summary:
        text += f"\nbridge_cudagraph [iteration {len(losses)}] {summary}\n"
    path.write_text(text)
    return path.name


@pytest.mark.parametrize(
    ("summary", "losses", "problem"),
    [
        ("language: graphs=3 replays=27 eager_fallbacks=0 | vision: graphs=12 replays=27", ["7.1E+00", "7.0E+00"], ""),
        ("language: graphs=3 replays=0 eager_fallbacks=27", ["7.1E+00", "7.0E+00"], "replays"),
        (None, ["7.1E+00", "7.0E+00"], "no capture summary"),
        ("language: graphs=3 replays=27", ["7.1E+00", "nan"], "non-finite"),
    ],
    ids=["replayed", "never-replayed", "no-summary", "nan"],
)
def test_a_graphed_run_must_replay_and_stay_finite(tmp_path, summary, losses, problem):
    eager = Run("eager", False, None, 0, 0, 1.0, useful_tokens_per_s=100.0, measured_steps=2, step_ms=10.0)
    eager.log = _log(tmp_path / "eager.log", ["7.1E+00", "7.0E+00"], None)
    graphed = Run("graphs", True, None, 0, 0, 1.0, useful_tokens_per_s=300.0, measured_steps=2, step_ms=3.0)
    graphed.log = _log(tmp_path / "graphs.log", losses, summary)
    check_against_eager([graphed, eager], tmp_path)
    table = render_table([graphed, eager])
    if not problem:
        assert graphed.ok and graphed.loss_vs_eager["loss"]["identical_at_printed_precision"]
        assert "| graphs | 0 | 300 | 3.00x |" in table
    else:
        assert not graphed.ok and any(problem in p for p in graphed.problems), graphed.problems
        assert "| graphs | 0 | failed:" in table


def test_the_runner_records_trains_refusal_on_this_machine(tmp_path):
    """On a machine without a GPU ``train`` refuses in one line (exit 2): every run is a failed row with that line,
    the JSON keeps the exit codes, and the runner exits 1."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: train would run")
    code = real_loop.main([RECIPE, "--iters", "2", "--out", str(tmp_path), "--timeout", "120"])
    assert code == 1
    import json

    record = json.loads((tmp_path / "real_loop.json").read_text())
    assert [r["variant"] for r in record["runs"]] == ["graphs", "eager"]
    assert all(r["exit_code"] == 2 and r["error"].startswith("error: train needs a CUDA GPU") for r in record["runs"])
    assert (tmp_path / "real_loop.md").read_text().count("failed: error: train needs a CUDA GPU") == 2


def test_a_timed_out_runs_log_holds_its_output_as_text(tmp_path, monkeypatch):
    """``subprocess.TimeoutExpired`` hands the output so far over as bytes even with ``text=True``: the log keeps it
    as the lines it was, not as a ``b'...'`` literal, and ends with the timeout line."""

    def timed_out(command, **kwargs):
        raise real_loop.subprocess.TimeoutExpired(command, 5.0, output=b"step 1\nstep 2\n", stderr=b"warning\n")

    monkeypatch.setattr(real_loop.subprocess, "run", timed_out)
    run = real_loop.run_one(RECIPE, 2, Variant(True), 0, tmp_path, 29700, 5.0)
    assert run.exit_code == 124 and run.error == "error: timed out after 5 s"
    assert (tmp_path / run.log).read_text() == "step 1\nstep 2\nwarning\n\nerror: timed out after 5 s"
