"""The report's numbers that every section shares: formatting, the paired phase's within-call interval (sign test and
moving-block bootstrap) and the host-time section, on hand-made records."""

from __future__ import annotations

import statistics

import pytest

from benchmarks import report


def test_formatting():
    assert report.fmt_ms(7.123) == "7.12" and report.fmt_ms(71.23) == "71.2"
    assert report.fmt_ms(None) == "n/a" and report.fmt_ms(float("nan")) == "n/a"
    assert report.fmt_diff(0.0) == "0 (exact)"
    assert report.fmt_diff(1e-3) == "1.0e-03"
    assert report.fmt_diff(0.19) == "**1.9e-01**"
    assert report.fmt_count(2000.4) == "2000" and report.fmt_count(1.25) == "1.2"


def _host(idle: float, *, ops: list[tuple[str, float]], runtime: list[tuple[str, float]]) -> dict:
    return {
        "steps": 4,
        "window_ms_per_step": 180.0,
        "idle_ms_per_step": idle,
        "idle_fraction": idle / 180.0,
        "idle_outside_ops_ms_per_step": 7.5,
        "idle_by_gap_length": [
            {"range": "< 10 us", "gaps_per_step": 2000.0, "ms_per_step": 6.0},
            {"range": ">= 1000 us", "gaps_per_step": 3.0, "ms_per_step": 20.0},
        ],
        "by_phase": {
            "forward": {"idle_ms_per_step": idle * 0.5, "wall_ms_per_step": 60.0},
            "optimizer_step": {"idle_ms_per_step": idle * 0.3, "wall_ms_per_step": 20.0},
            "(unmarked)": {"idle_ms_per_step": idle * 0.2, "wall_ms_per_step": 1.0},
        },
        "top_cpu_ops": [
            {"name": n, "idle_ms_per_step": v, "calls_per_step": 2.0, "cpu_ms_per_step": v} for n, v in ops
        ],
        "top_runtime": [
            {"name": n, "idle_ms_per_step": v, "calls_per_step": 1.0, "cpu_ms_per_step": v} for n, v in runtime
        ],
    }


def _host_config(busy: float, source: str = "profiler") -> tuple[dict, dict]:
    ours = {"status": "ok", "step_ms_median": 172.0, "gpu_busy": busy, "gpu_busy_source": source}
    ours["host_time"] = _host(
        50.0, ops=[("aten::nonzero", 12.5), ("aten::copy_", 4.0)], runtime=[("cudaGraphLaunch", 3.25)]
    )
    eager = {"status": "ok", "step_ms_median": 469.0, "gpu_busy": 0.26, "gpu_busy_source": "profiler"}
    eager["host_time"] = _host(350.0, ops=[("aten::copy_", 40.0)], runtime=[("cudaLaunchKernel", 200.0)])
    eager["host_time"]["by_phase"]["vision_backward"] = {"idle_ms_per_step": 90.0, "wall_ms_per_step": 95.0}
    return ours, eager


def test_host_time_section_for_ours_under_the_target():
    lines = report.host_time_section(*_host_config(0.70))
    text = "\n".join(lines)
    assert lines[0] == "### Where the remaining host time goes"
    assert report.host_time_section(*_host_config(0.96)) == []  # at the target: nothing to say
    assert "Ours' GPU busy is 0.70, under the 0.95 target" in text
    assert "the GPU ran no kernel for 50.0 ms per step (28% of the step; eager: 350.0 ms)" in text
    assert "| forward | 25.0 | 60.0 | 175.0 | 60.0 |" in text  # forward: ours idle, ours wall, eager idle, eager wall
    assert "| vision_backward | n/a | n/a | 90.0 | 95.0 |" in text
    assert "| `aten::nonzero` | 12.5 | 2.0 | 12.5 | - |" in text  # not among eager's top ops
    assert "| `aten::copy_` | 4.00 | 2.0 | 4.00 | 40.0 |" in text
    assert "| `cudaGraphLaunch` | 3.25 | 1.0 | 3.25 | - |" in text
    assert "7.50 ms of ours' idle time per step overlaps no CPU op" in text
    assert "< 10 us: 2000 gaps, 6.00 ms; >= 1000 us: 3.0 gaps, 20.0 ms" in text
    assert "Caveat" not in text
    estimated = "\n".join(report.host_time_section(*_host_config(0.70, source="eager_kernel_time")))
    assert "Caveat: the profiler missed graph kernels (GPU busy from eager's)" in estimated


def test_paired_verdict_takes_the_wider_of_the_sign_test_and_the_block_bootstrap():
    # 30 pairs: the sign test's 95% interval is between the 10th and 21st smallest ratios.
    ratios = [1.0 + 0.01 * k for k in range(-5, 25)]  # ours faster in 24 of 30 pairs
    judged = report.paired_verdict(ratios)
    assert judged["pairs"] == 30 and judged["ours_faster_pairs"] == 24
    assert judged["ci_sign_test"] == pytest.approx([sorted(ratios)[9], sorted(ratios)[20]])
    lo, hi = judged["ci"]
    assert lo == min(judged["ci_sign_test"][0], judged["ci_block_bootstrap"][0])
    assert hi == max(judged["ci_sign_test"][1], judged["ci_block_bootstrap"][1])
    assert lo <= judged["median"] <= hi
    assert judged["median"] == pytest.approx(statistics.median(ratios))
    assert judged["verdict"] == "faster"
    mixed = [1.0 + 0.01 * k for k in range(-15, 15)]
    assert report.paired_verdict(mixed)["verdict"] == "within timing noise"
    assert report.paired_verdict([1 / r for r in ratios])["verdict"] == "slower"
    few = report.paired_verdict([1.2] * 5)  # P(all 5 on one side) = 1/16 > 2.5%: no 95% interval
    assert few["ci"] is None and few["verdict"] is None


def test_the_block_bootstrap_widens_the_interval_of_serially_correlated_pairs():
    """Ratios that drift over the run (the first half of the steps slow, the second fast, as when the host's
    state changes mid-run) carry less information than 30 independent pairs; pairs in shuffled order do not."""
    import random

    drift = [1.02 + 0.002 * (k % 5) for k in range(15)] + [1.06 + 0.002 * (k % 5) for k in range(15)]
    shuffled = drift[:]
    random.Random(3).shuffle(shuffled)
    width = lambda ci: ci[1] - ci[0]  # noqa: E731
    in_order = report.block_bootstrap_ci(drift, block=5)
    independent = report.block_bootstrap_ci(shuffled, block=1)
    assert width(in_order) > width(independent)
    assert report.block_bootstrap_ci(drift) == report.block_bootstrap_ci(drift)  # seeded
    assert report.block_bootstrap_ci(drift[:5]) is None


def test_step_over_kernel_compares_the_same_micro_batches():
    """Kernel time comes from the profiled steps; the step time it is set against is the unprofiled median of those
    steps' own micro-batches, not the median of every measured step (which mixes in other micro-batches)."""
    rec = {"step_ms_median": 169.6, "step_ms_same_microbatches": 175.3, "kernel_ms_per_step": 162.3}
    assert report.step_over_kernel(rec) == pytest.approx(175.3 / 162.3)
    assert report.step_over_kernel({"step_ms_median": 169.6, "kernel_ms_per_step": 162.3}) == pytest.approx(
        169.6 / 162.3
    )  # a record from before the field
    assert report.step_over_kernel({"step_ms_median": 169.6}) is None
    unmatched = {"step_ms_median": 169.6, "step_ms_same_microbatches": None, "kernel_ms_per_step": 162.3}
    assert report.step_over_kernel(unmatched) is None  # never the median of other micro-batches


def test_encoder_and_mfu_section_lists_what_each_variant_measured():
    data = {
        "variants": {
            "eager_packed": {
                "status": "ok",
                "vision_calls": 16,
                "vision_fwd_ms": 4.0,
                "vision_bwd_ms": 6.5,
                "vision_ms": 10.5,
                "vision_microbatches_per_step": 2.0,
            },
            "eager_padded": {
                "status": "ok",
                "vision_calls": 16,
                "vision_fwd_ms": 4.0,
                "vision_bwd_ms": 6.5,
                "vision_ms": 10.5,
                "vision_microbatches_per_step": 2.0,
                "mfu": 0.123,
                "mfu_at_kernel_time": 0.2,
            },
            "ours_packed": {"status": "failed"},
        }
    }
    text = "\n".join(report.encoder_and_mfu_section(data))
    assert "| eager_packed | 4.00 | 6.50 | 10.5 | 2.00 | - | - |" in text
    assert "| eager_padded | 4.00 | 6.50 | 10.5 | 2.00 | 12.3% | 20.0% |" in text
    assert "ours_packed" not in text
    assert report.encoder_and_mfu_section({"variants": {}}) == []


def test_a_control_beyond_the_floor_reads_as_eager_spread_not_as_a_failure():
    """A second eager model farther from the first than the first from itself (a tiny MoE once: 9.0e-4 against a
    floor of 4.5e-7) says the floor is tight; a graphed variant there is BEYOND THE FLOOR."""
    fixed = {
        "grads": {"grad_max_rel_l2": 9.0e-4, "grad_exact_fraction": 0.76, "grad_missing": []},
        "floor_grad_max_rel_l2": 4.5e-7,
        "within_floor": False,
    }
    assert report.fmt_grad_parity(fixed, control=True).endswith("two eager models' own spread: the floor is tighter")
    assert report.fmt_grad_parity(fixed).endswith("BEYOND THE FLOOR")
    rec = {"parity": {"reference": "eager_packed", "fixed_batch": {"loss_max_abs": 0.0, **fixed}}}
    assert "own spread" in report._fmt_parity(report.CONTROL, rec)
    assert "BEYOND THE FLOOR" in report._fmt_parity("ours_packed", rec)
