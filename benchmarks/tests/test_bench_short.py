"""A very short benchmark run (tiny Qwen3-VL only, 5 measured steps): ours is faithful and faster than eager.

Writes only under pytest's tmp_path (never into the repository).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_short_bench_tiny(world, record, tmp_path):
    from benchmarks import bench
    from benchmarks import configs as bench_configs
    from bridge_cudagraph.testing.parity import LOSS_BOUND, assert_captured
    from bridge_cudagraph.testing.world import parallel_state_untouched

    out_dir = tmp_path / "bench"
    data = bench.run(
        [bench_configs.tiny_config()],
        out_dir=out_dir,
        measured_steps=5,
        warmup_steps=3,
        world=world,
        # No torch.profiler here: a CUPTI fault would take the whole GPU test session down with it; the
        # benchmark command itself measures the GPU-busy fraction.
        profile=False,
        rounds=2,
        command="pytest tests/gpu/test_bench_short.py",
    )

    assert (out_dir / "bench.json").exists() and (out_dir / "bench.md").exists()
    (config,) = data["configs"]
    variants = config["variants"]
    eager, ours, upstream = variants["eager"], variants["ours"], variants.get("upstream", {})
    assert eager["status"] == "ok", eager.get("traceback")
    assert ours["status"] == "ok", ours.get("traceback")
    record(
        phase="bench_tiny_5_steps",
        eager_ms=eager["step_ms_median"],
        upstream_ms=upstream.get("step_ms_median"),
        ours_ms=ours["step_ms_median"],
        upstream_status=upstream.get("status"),
        upstream_loss_diff=upstream.get("loss_max_abs_diff_vs_eager"),
        ours_loss_diff=ours["loss_max_abs_diff_vs_eager"],
        ours_per_token_diff=ours["fixed_batch"]["loss_max_abs_diff"],
        ours_vision_ms=ours.get("vision_ms"),
        eager_vision_ms=eager.get("vision_ms"),
    )

    # Parity: every step's loss within DESIGN.md's bound (the steps run the vision backward, at the eager noise
    # floor; NaN-safe: every per-step difference must be finite, max() alone would skip a NaN).
    import math

    assert all(math.isfinite(x) for x in ours["loss_abs_diff_per_step"]), ours["loss_abs_diff_per_step"]
    assert ours["loss_max_abs_diff_vs_eager"] <= LOSS_BOUND, ours["loss_abs_diff_per_step"]
    # README: ours' fixed-batch per-token loss is bit-exact (== 0.0 is False for NaN).
    assert ours["fixed_batch"]["loss_max_abs_diff"] == 0.0, ours["fixed_batch"]
    # Speed: graphed steps are faster than eager ones.
    assert ours["step_ms_median"] < eager["step_ms_median"], (ours["step_ms"], eager["step_ms"])
    # The graphs really replayed: every measured micro-batch fits a vision budget, none fell back.
    assert ours["eager_fallbacks"] == 0
    for sub in ("language", "vision"):  # both enabled in the tiny config: graphs, replays, no failed capture
        assert_captured(ours["counters"][sub], where=f"ours {sub}")
    assert ours["vision_replays"] >= 5
    assert ours["capture_s"] > 0 and ours["graph_memory_bytes"] > 0
    assert ours["vision_fwd_ms"] is not None and ours["vision_calls"] == 5
    # The second, timing-only round (upstream and ours rebuilt and captured again after the control, B A).
    (again,) = ours["repeat_rounds"]
    assert again["status"] == "ok" and len(again["step_ms"]) == 5, again.get("traceback")
    assert again["eager_fallbacks"] == 0 and again["position"] > variants["eager_repeat"]["position"]
    assert "fixed_batch" not in again and "profile" not in again
    if upstream.get("status") == "ok":
        assert upstream["repeat_rounds"][0]["position"] == again["position"] + 1
        # The paired phase: both graphed models side by side, their measured steps interleaved.
        paired = config["paired"]
        assert paired["status"] == "ok", paired.get("traceback")
        assert len(paired["ratios"]) == 5 and all(len(t) == 5 for t in paired["step_ms"].values())
        assert paired["position"] == upstream["repeat_rounds"][0]["position"] + 1
    assert parallel_state_untouched()
