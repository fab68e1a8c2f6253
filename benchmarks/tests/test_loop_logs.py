"""benchmarks.loop_logs on log lines in Bridge's own format (copied from run 18's raw logs)."""

from __future__ import annotations

import math

import pytest

from benchmarks.loop_logs import compare, read_log

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
