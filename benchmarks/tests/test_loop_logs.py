"""benchmarks.loop_logs on log lines in Bridge's own format (copied from run 18's raw logs)."""

from __future__ import annotations

import math

import pytest

from benchmarks.loop_logs import compare, main, read_log

LINE = (
    " [2026-12-01 11:05:42] iteration        {i}/      30 | consumed samples:            2 | elapsed time per "
    "iteration (ms): 8887.3 | learning rate: 1.500000E-04 | global batch size:     2 | lm loss: {loss} | loss "
    "scale: 1.0 | grad norm: {norm} | number of skipped iterations:   0 | number of nan iterations:   0 |"
)


def _log(tmp_path, name, rows, summary=None):
    text = "\n".join(LINE.format(i=i, loss=loss, norm=norm) for i, loss, norm in rows)
    if summary:
        text += f"\nbridge_cudagraph [iteration {rows[-1][0]}] {summary}\n"
    path = tmp_path / name
    path.write_text(text)
    return path


def test_identical_runs_and_the_first_difference(tmp_path):
    ref = read_log(_log(tmp_path, "a.log", [(1, "7.099136E+00", "36.534"), (2, "7.205589E+00", "42.888")]))
    same = read_log(
        _log(tmp_path, "b.log", [(1, "7.099136E+00", "36.534"), (2, "7.205589E+00", "42.888")], "language: x")
    )
    other = read_log(_log(tmp_path, "c.log", [(1, "7.099136E+00", "36.534"), (2, "7.205590E+00", "42.888")]))
    assert same["capture"] == "language: x"
    assert compare(same, ref, 1)["loss"]["identical_at_printed_precision"]
    d = compare(other, ref, 1)["loss"]
    assert not d["identical_at_printed_precision"] and d["first_different_iteration"] == 2
    assert d["max_abs"] == pytest.approx(1e-6)
    assert compare(other, ref, 1)["grad_norm"]["identical_at_printed_precision"]


def test_a_nan_step_is_never_identical(tmp_path):
    ref = read_log(_log(tmp_path, "a.log", [(1, "7.099136E+00", "36.534"), (2, "7.205589E+00", "42.888")]))
    nan = read_log(_log(tmp_path, "n.log", [(1, "7.099136E+00", "36.534"), (2, "nan", "nan")]))
    d = compare(nan, ref, 1)["loss"]
    assert not d["identical_at_printed_precision"] and d["nonfinite_steps"] == [1] and math.isnan(d["max_abs"])


def test_a_resumed_run_is_compared_from_its_first_iteration_on(tmp_path):
    ref = read_log(_log(tmp_path, "a.log", [(i, f"{i}.000000E+00", "1.0") for i in range(1, 5)]))
    resumed = read_log(_log(tmp_path, "r.log", [(i, f"{i}.000000E+00", "1.0") for i in range(3, 5)]))
    assert compare(resumed, ref, 3)["loss"]["steps"] == 2
    with pytest.raises(ValueError, match="lacks"):
        compare(ref, resumed, 1)


def test_the_floor_verdict_and_its_exit_status(tmp_path):
    """``--floor``: a graphed run inside 2x the eager-vs-eager difference passes (exit 0), one outside fails (exit 1),
    and so do one without replays, one without a capture summary and one with a NaN step; both series count."""
    ref = _log(tmp_path, "eager.log", [(1, "7.000000E+00", "36.000"), (2, "7.100000E+00", "40.000")])
    again = _log(tmp_path, "again.log", [(1, "7.000000E+00", "36.000"), (2, "7.100100E+00", "40.010")])
    replayed = "language: graphs=8 graphed_steps=1 replays=2 eager_fallbacks=0 | vision: graphs=4 replays=2"
    never = "language: graphs=8 graphed_steps=0 replays=0 eager_fallbacks=2"
    inside_rows = [(1, "7.000000E+00", "36.000"), (2, "7.100150E+00", "40.015")]
    inside = _log(tmp_path, "in.log", inside_rows, replayed)
    outside = _log(tmp_path, "out.log", [(1, "7.000000E+00", "36.000"), (2, "7.100150E+00", "40.030")], replayed)
    nan = _log(tmp_path, "nan.log", [(1, "7.000000E+00", "36.000"), (2, "nan", "40.000")], replayed)
    unreplayed = _log(tmp_path, "eager_fallback.log", inside_rows, never)
    no_summary = _log(tmp_path, "no_summary.log", inside_rows)
    out = tmp_path / "x.json"
    assert main(["--out", str(out), "--reference", str(ref), "--floor", str(again), str(inside)]) == 0
    assert main(["--out", str(out), "--reference", str(ref), "--floor", str(again), str(outside)]) == 1
    # Inside the floor in numbers, but no replay (every micro-batch fell back to eager) or no capture at all.
    assert main(["--out", str(out), "--reference", str(ref), "--floor", str(again), str(unreplayed)]) == 1
    assert main(["--out", str(out), "--reference", str(ref), "--floor", str(again), str(no_summary)]) == 1
    assert main(["--out", str(out), "--reference", str(ref), "--floor", str(again), str(nan)]) == 1
    import json

    result = json.loads(out.read_text())
    assert result["floor"]["loss"] == pytest.approx(1e-4) and result["runs"]["nan.log"]["within_floor"] is False
