"""The benchmark's CPU side: report rendering from a synthetic ``bench.json``, merging, the configuration matrix,
the synthetic data, the GPU-busy arithmetic on a synthetic profiler trace, and the command line."""

from __future__ import annotations

import json
import math
import shutil
import statistics
from pathlib import Path

import pytest

from benchmarks import bench_report, bench_trace
from benchmarks import configs as bench_configs


def _variant(step_ms, *, diff=None, per_token=None, busy=0.9, capture=None, graph_mib=None, source="profiler"):
    v = {
        "status": "ok",
        "step_ms_median": step_ms,
        "gpu_busy": busy,
        "gpu_busy_source": source,
        "peak_memory_bytes": 12 * 2**30,
        "vision_ms": 3.5,
        "vision_fwd_ms": 1.25,
        "vision_bwd_ms": 2.25,
    }
    if diff is not None:
        v.update(
            loss_max_abs_diff_vs_eager=diff,
            capture_s=capture,
            graph_memory_bytes=graph_mib * 2**20,
            fixed_batch={"loss_max_abs_diff": per_token, "loss_rel_l2": 0.0, "grad_norm_rel_diff": 0.0},
        )
    return v


def _synthetic() -> dict:
    eager = _variant(73.0, busy=0.41)
    upstream = _variant(
        29.0, diff=0.36, per_token=0.68, busy=0.97, capture=2.5, graph_mib=120, source="eager_kernel_time"
    )
    ours = _variant(28.5, diff=0.0, per_token=0.0, busy=0.98, capture=3.1, graph_mib=180)
    upstream["speedup_vs_eager"] = 73.0 / 29.0
    ours["speedup_vs_eager"] = 73.0 / 28.5
    eager["speedup_vs_eager"] = 1.0
    ours["counters"] = {"vision": {"replays": 33, "eager_fallbacks": 0}}
    ours["vision_graph_memory_per_budget"] = {"96": 2**20, "768": 8 * 2**20}
    small = {
        "name": "small-mbs1-seq2048",
        "description": "small",
        "variants": {
            "eager": _variant(410.0),
            "upstream": {"status": "failed", "error": "RuntimeError: boom | with a pipe\nsecond line"},
            "ours": {
                **_variant(380.0, diff=2e-4, per_token=5e-3, capture=20.0, graph_mib=9000),
                "speedup_vs_eager": 1.08,
            },
        },
    }
    return {
        "meta": {
            "gpu": "NVIDIA H200",
            "date": "2026-11-29",
            "torch": "2.11.0",
            "transformer_engine": "2.20.2",
            "megatron_core": "0.19.2",
            "megatron_bridge": "0.6.2",
            "command": "python -m benchmarks.bench --quick",
            "measured_steps": 30,
            "warmup_steps": 3,
            "profiler_sees_graph_kernels": True,
        },
        "configs": [
            {
                "name": "tiny",
                "description": "Tiny Qwen3-VL",
                "patches_per_microbatch": [64, 352, 720, 128],
                "frames_per_microbatch": [1, 3, 8, 2],
                "vision_budgets": [96, 192, 384, 768],
                "vision_max_segments": 12,
                "upstream_vision_seq_length": 768,
                "variants": {"eager": eager, "upstream": upstream, "ours": ours},
            },
            small,
        ],
    }


def test_render_writes_markdown_tables_and_png(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(_synthetic()))
    out = bench_report.render(path)
    md = out["md"].read_text()
    assert out["md"] == tmp_path / "bench.md"
    header = "| " + " | ".join(bench_report.COLUMNS) + " |"
    assert md.count(header) == 2  # one table per configuration
    assert "## tiny" in md and "## small-mbs1-seq2048" in md
    tiny_rows = {line.split(" | ")[0].strip("| "): line for line in md.splitlines() if line.startswith("| ")}
    assert "| eager | 73.0 | 1.00x | 0.41 | - |" in md
    assert "| ours | 28.5 | 2.56x | 0.98 | 3.10 | 12.0 | 180 | 0 (exact) | 0 (exact) | 3.50 (1.25 + 2.25) |" in md
    # over DESIGN.md's bound: bold; estimated busy: dagger
    assert "| upstream | 29.0 | 2.52x | 0.97† | 2.50 | 12.0 | 120 | **3.6e-01** | **6.8e-01** |" in md
    assert "failed: RuntimeError: boom / with a pipe" in md  # first line only, no table-breaking pipe
    assert "2.0e-04" in md and "**5.0e-03**" in md
    assert "33 graph replays, 0 eager fallbacks" in md
    assert "![step time per configuration and variant](bench.png)" in md
    assert "The profiler saw the kernels inside CUDA graph replays: yes" in md
    assert tiny_rows  # every table line starts with a pipe
    if out["png"] is not None:  # matplotlib present (requirements-cpu.txt)
        data = out["png"].read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_render_survives_missing_fields(tmp_path):
    data = {"meta": {}, "configs": [{"name": "x", "variants": {"eager": {"status": "ok"}}}]}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    md = bench_report.render(path)["md"].read_text()
    assert "| eager | n/a |" in md
    assert "| upstream | not run |" in md


def test_formatting():
    assert bench_report.fmt_ms(7.123) == "7.12" and bench_report.fmt_ms(71.23) == "71.2"
    assert bench_report.fmt_ms(None) == "n/a" and bench_report.fmt_ms(float("nan")) == "n/a"
    assert bench_report.fmt_diff(0.0) == "0 (exact)"
    assert bench_report.fmt_diff(1e-3) == "1.0e-03"
    assert bench_report.fmt_diff(0.19) == "**1.9e-01**"
    assert bench_report.fmt_count(2000.4) == "2000" and bench_report.fmt_count(1.25) == "1.2"


def test_merge_replaces_by_name_and_renders(tmp_path):
    first, second = _synthetic(), _synthetic()
    second["meta"]["command"] = "second"
    second["configs"] = [dict(second["configs"][1], description="replaced"), dict(second["configs"][0], name="new")]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(first))
    b.write_text(json.dumps(second))
    target = bench_report.merge([a, b], tmp_path / "merged")
    merged = json.loads(target.read_text())
    assert [c["name"] for c in merged["configs"]] == ["tiny", "small-mbs1-seq2048", "new"]
    assert merged["configs"][1]["description"] == "replaced"
    assert len(merged["meta"]["merged_from"]) == 2
    assert (tmp_path / "merged" / "bench.md").exists()


# ------------------------------------------------------------------------------------------ noise floor, host time
REPO = Path(__file__).resolve().parents[2]
#: The padded benchmark's committed runs of 2026-11-29, in the folder of the claim they support.
BENCH = REPO / "results" / "padded-vs-upstream" / "bench"


def test_a_bench_json_from_before_the_control_still_renders(tmp_path):
    """results/padded-vs-upstream/bench/bench_quick_1808.json (the quick run of 2026-11-29 18:08) has no eager_repeat
    and no host_time: it renders, says so, and the repository's copy is left alone (rendered into a tmp dir)."""
    source = BENCH / "bench_quick_1808.json"
    path = tmp_path / "bench.json"
    shutil.copy(source, path)
    out = bench_report.render(path)
    md = out["md"].read_text()
    assert "| " + " | ".join(bench_report.SUMMARY_COLUMNS) + " |" in md
    assert "| tiny | 104.1 | failed | 45.5 (2.29x) | n/a | n/a | 0 (exact) | not run | 0.08 |" in md
    assert "| small-mbs1-seq2048 | 469.4 | failed | 171.9 (2.73x) | n/a | n/a | **7.1e-02** | not run | 0.70 |" in md
    assert "| eager_repeat |" not in md  # a control that was never asked for gets no row
    assert "Noise floor" not in md
    assert md.count("### Where the remaining host time goes") == 2  # ours' busy 0.08 and 0.70 < 0.95
    assert "no host-time profile (older bench, or --no-profile)" in md
    if out["png"] is not None:
        assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _with_control() -> dict:
    """_synthetic() plus the control: tiny exact everywhere; small: ours 2e-4, eager vs eager 1e-4; a third
    configuration where eager repeats bit-exactly and ours drifts."""
    data = _synthetic()
    tiny, small = data["configs"]
    control = _variant(74.0, diff=0.0, per_token=0.0, capture=None, graph_mib=0)
    control.update(speedup_vs_eager=73.0 / 74.0, loss_abs_diff_per_step=[0.0, 0.0])
    tiny["variants"]["eager_repeat"] = control
    tiny["variants"]["ours"]["loss_abs_diff_per_step"] = [0.0, 0.0]
    noisy = _variant(411.0, diff=1e-4, per_token=0.0, graph_mib=0)
    noisy["loss_abs_diff_per_step"] = [0.0, 0.0, 1e-4]
    noisy["grad_norm_max_rel_diff_vs_eager"] = 3e-5
    small["variants"]["eager_repeat"] = noisy
    small["variants"]["ours"]["loss_abs_diff_per_step"] = [0.0, 2e-4, 1e-4]
    exact_eager = {
        "name": "deterministic",
        "variants": {
            "eager": _variant(100.0),
            "eager_repeat": _variant(100.0, diff=0.0, per_token=0.0, graph_mib=0),
            "ours": _variant(50.0, diff=5e-3, per_token=0.0, capture=1.0, graph_mib=10),
        },
    }
    data["configs"].append(exact_eager)
    return data


def test_noise_floor_column_rows_and_notes(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(_with_control()))
    md = bench_report.render(path)["md"].read_text()
    assert (
        "| tiny | 73.0 | 29.0 (2.52x) | 28.5 (2.56x) | 1.02x (faster, eager vs eager ±1.4%) "
        "| **3.6e-01** (above noise) | 0 (exact) | 0 (exact) |" in md
    )
    assert (
        "| small-mbs1-seq2048 | 410.0 | failed | 380.0 (1.08x) | n/a | n/a | 2.0e-04 (within noise) | 1.0e-04 |" in md
    )
    assert "| deterministic | 100.0 | not run | 50.0 (n/a) | n/a | n/a | **5.0e-03** (above noise) | 0 (exact) |" in md
    # The control's row: no capture, no graph memory, but its differences from eager.
    assert "| eager_repeat | 74.0 | 0.99x | 0.90 | - | 12.0 | - | 0 (exact) | 0 (exact) |" in md
    section = md.split("## small-mbs1-seq2048")[1].split("\n## ")[0]
    rows = [line.split(" | ")[0].strip("| ") for line in section.splitlines()]
    assert [r for r in rows if r in bench_report.VARIANTS] == ["eager", "eager_repeat", "upstream", "ours"]
    assert (
        "- Noise floor (eager trained again: same weights, batches and steps): max abs loss diff 1.0e-04 over 3 "
        "steps (first differs at step 2), fixed-batch per-token diff 0 (exact), grad-norm max rel. diff 3.0e-05."
    ) in md
    assert (
        "- ours vs the noise floor (first differs at step 1): loss over the run: 2.0e-04 vs eager-vs-eager 1.0e-04 "
        "(2x), within 3x the noise floor; fixed-batch per-token loss: 5.0e-03 while eager repeats bit-exactly, so the "
        "drift is not noise."
    ) in md
    assert "loss over the run: 5.0e-03 while eager repeats bit-exactly, so the drift is not noise" in md
    assert "- ours vs the noise floor: loss over the run: bit-exact (eager vs eager too); fixed-batch" in md
    assert "max abs loss diff 0 (exact), fixed-batch" in md  # no per-step diffs recorded: no step count
    assert "eager once more as a run-to-run control" in md


@pytest.mark.parametrize(
    ("diff", "floor", "within", "ratio", "text"),
    [
        (0.0, 0.0, True, None, "bit-exact (eager vs eager too)"),
        (0.0, 2e-3, True, 0.0, "bit-exact (eager vs eager: 2.0e-03)"),
        (1e-3, 0.0, False, None, "not noise"),
        (2e-3, 1e-3, True, 2.0, "within 3x the noise floor"),
        (3e-3, 1e-3, True, 3.0, "within 3x"),
        (4e-3, 1e-3, False, 4.0, "above 3x the noise floor"),
    ],
)
def test_noise_floor_verdict(diff, floor, within, ratio, text):
    ours = _variant(10.0, diff=diff, per_token=0.0, graph_mib=1)
    control = _variant(20.0, diff=floor, per_token=1e-6, graph_mib=0)
    out = bench_report.noise_floor_verdict(ours, control)
    assert out["within"] is within and out["noise_floor"] == floor
    assert out["ratio"] == (None if ratio is None else pytest.approx(ratio))
    assert text in out["summary"]
    assert out["fixed_batch_within"] is True  # ours' fixed batch is exact, the control's is not


def test_noise_floor_verdict_without_a_usable_control():
    ours = _variant(10.0, diff=1e-2, per_token=0.0, graph_mib=1)
    assert bench_report.noise_floor_verdict(ours, None)["within"] is None
    failed = bench_report.noise_floor_verdict(ours, {"status": "failed"})
    assert failed["within"] is None and "no noise-floor control" in failed["summary"]
    assert bench_report.noise_floor_verdict({"status": "failed"}, ours)["within"] is None
    assert bench_report.first_nonzero([0, 0.0, None, 3e-9, 1]) == 3
    assert bench_report.first_nonzero([0.0, 0.0]) is None


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


def _host_config(busy: float, source: str = "profiler") -> dict:
    ours = _variant(172.0, diff=0.0, per_token=0.0, busy=busy, capture=9.0, graph_mib=100, source=source)
    ours["host_time"] = _host(
        50.0, ops=[("aten::nonzero", 12.5), ("aten::copy_", 4.0)], runtime=[("cudaGraphLaunch", 3.25)]
    )
    eager = _variant(469.0, busy=0.26)
    eager["host_time"] = _host(350.0, ops=[("aten::copy_", 40.0)], runtime=[("cudaLaunchKernel", 200.0)])
    eager["host_time"]["by_phase"]["vision_backward"] = {"idle_ms_per_step": 90.0, "wall_ms_per_step": 95.0}
    return {"name": "small-mbs1-seq2048", "variants": {"eager": eager, "ours": ours}}


def test_host_time_section_for_ours_under_the_target():
    lines = bench_report.host_time_section(_host_config(0.70))
    text = "\n".join(lines)
    assert lines[0] == "### Where the remaining host time goes"
    assert "Ours' GPU busy is 0.70, under the 0.95 target" in text
    assert "the GPU ran no kernel for 50.0 ms per step (28% of the step; eager: 350.0 ms)" in text
    assert "| forward: forward outside the encoder and the language model's call" in text
    assert "| 25.0 | 60.0 | 175.0 | 60.0 |" in text  # forward: ours idle, ours wall, eager idle, eager wall
    assert "| vision_backward: vision encoder backward (autograd thread) | n/a | n/a | 90.0 | 95.0 |" in text
    assert "| `aten::nonzero` | 12.5 | 2.0 | 12.5 | - |" in text  # not among eager's top ops
    assert "| `aten::copy_` | 4.00 | 2.0 | 4.00 | 40.0 |" in text
    assert "| `cudaGraphLaunch` | 3.25 | 1.0 | 3.25 | - |" in text
    assert "7.50 ms of ours' idle time per step overlaps no CPU op" in text
    assert "< 10 us: 2000 gaps, 6.00 ms; >= 1000 us: 3.0 gaps, 20.0 ms" in text
    assert "Caveat" not in text
    estimated = "\n".join(bench_report.host_time_section(_host_config(0.70, source="eager_kernel_time")))
    assert "Caveat: ours' GPU-busy fraction was estimated" in estimated


def test_host_time_section_only_under_the_target(tmp_path):
    assert bench_report.host_time_section(_host_config(0.95)) == []
    assert bench_report.host_time_section(_host_config(0.99)) == []
    failed = _host_config(0.5)
    failed["variants"]["ours"]["status"] = "failed"
    assert bench_report.host_time_section(failed) == []
    broken = _host_config(0.5)
    broken["variants"]["ours"]["host_time"] = {"error": "RuntimeError: no steps"}
    assert "RuntimeError: no steps" in "\n".join(bench_report.host_time_section(broken))
    data = {"meta": {}, "configs": [_host_config(0.7), {**_host_config(0.97), "name": "fast"}]}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    md = bench_report.render(path)["md"].read_text()
    assert md.count("### Where the remaining host time goes") == 1
    assert md.index("### Where the remaining host time goes") < md.index("## fast")


def test_mark_unfinished_and_merge_order():
    runs = [
        {"meta": {"command": "a", "gpu": "G"}, "configs": [{"name": "y", "status": "complete", "variants": {}}]},
        {
            "meta": {"command": "b"},
            "configs": [{"name": "x", "status": "running", "variants": {"eager": {"status": "ok"}}}],
        },
    ]
    merged = bench_report.merge_data(runs, order=["x", "y", "z"])
    assert [c["name"] for c in merged["configs"]] == ["x", "y"]
    assert merged["meta"]["command"] == "a ; b" and merged["meta"]["gpu"] == "G"
    why = {"error": "child died", "log": "l.log", "log_tail": "tail"}
    bench_report.mark_unfinished(merged, {"x": why, "y": why, "z": why})
    by_name = {c["name"]: c for c in merged["configs"]}
    assert by_name["x"]["status"] == "incomplete" and by_name["x"]["variants"] == {"eager": {"status": "ok"}}
    assert by_name["y"]["status"] == "complete" and "error" not in by_name["y"]  # finished: untouched
    assert by_name["z"] == {"name": "z", "status": "failed", "variants": {}, **why}
    md = bench_report.render_markdown(merged)
    assert "| z | failed | failed | failed |" in md and "| x | n/a | failed | failed |" in md
    assert "Last lines of its log:" in md and "(log: `l.log`)" in md


def test_bar_annotation_colours_only_unexplained_drift():
    red, black = "#c0392b", "black"
    ours = _variant(10.0, diff=7e-2, per_token=0.0, graph_mib=1)
    lines, colour = bench_report._bar_annotation("ours", ours, _variant(20.0, diff=5e-2, per_token=0.0, graph_mib=0))
    assert colour == black and "floor 5.0e-02" in lines and "Δloss 7.0e-02" in lines
    assert bench_report._bar_annotation("ours", ours, _variant(20.0, diff=0.0, per_token=0.0, graph_mib=0))[1] == red
    assert bench_report._bar_annotation("ours", ours, None)[1] == red
    small = _variant(10.0, diff=1e-4, per_token=0.0, graph_mib=1)
    assert bench_report._bar_annotation("ours", small, None)[1] == black
    assert bench_report._bar_annotation("eager", _variant(10.0), None) == (["10.0 ms"], black)


# ------------------------------------------------------------------------------------------ bench.py, CPU parts
bench = pytest.importorskip("benchmarks.bench")


def test_config_matrix():
    quick = [c.name for c in bench_configs.quick_configs()]
    full = [c.name for c in bench_configs.full_configs()]
    assert quick == ["tiny", "small-mbs1-seq2048"]
    assert full == ["tiny", "small-mbs1-seq2048", "small-mbs2-seq2048", "small-mbs1-seq4096", "small-mbs2-seq4096"]
    assert [c.name for c in bench.select_configs(names="tiny, small-mbs2-seq4096")] == ["tiny", "small-mbs2-seq4096"]
    with pytest.raises(ValueError, match="unknown bench configuration"):
        bench.select_configs(names=["huge"])


@pytest.mark.parametrize("cfg", [*bench_configs.full_configs()], ids=lambda c: c.name)
def test_images_fit_and_budgets_hold_every_microbatch(cfg):
    budgets = cfg.vision_budgets()
    assert budgets == sorted(set(budgets)) and all(b % 64 == 0 and b >= 64 for b in budgets)
    # The top is the data's largest micro-batch rounded up to 64 patches, upstream's one length the same.
    largest = max(cfg.patches_per_microbatch())
    assert largest <= budgets[-1] == cfg.upstream_vision_seq_length() < largest + 64
    # Geometric rungs down to a 16th of the top: each micro-batch pads by at most a fifth of its rung (halvings of
    # the top padded up to half).
    assert budgets[0] <= max(64, -(-budgets[-1] // 16 // 64) * 64)
    for patches in cfg.patches_per_microbatch():
        rung = min(b for b in budgets if b >= patches)
        assert rung <= max(1.25 * patches, patches + 63), (patches, rung, budgets)
    assert max(cfg.frames_per_microbatch()) <= cfg.vision_max_segments()
    for mb in cfg.image_sets:
        assert len(mb) == cfg.micro_batch_size
        for sample in mb:
            tokens = sum(bench_configs.image_tokens(g) + 9 for g in sample)
            assert tokens < cfg.seq_length
            for t, h, w in sample:
                assert h % 2 == 0 and w % 2 == 0 and t >= 1
    if cfg.model == "small":
        counts = sorted({len(s) for mb in cfg.image_sets for s in mb})
        assert counts == [1, 2, 3, 4]


def test_small_batches_use_the_real_vocabulary():
    import torch

    from bridge_cudagraph.examples import tiny

    cfg = bench_configs.small_config(2, 2048)
    batch = bench.make_batch(cfg, cfg.image_sets[0], seed=5, device="cpu")
    ids, labels = batch["input_ids"], batch["labels"]
    assert ids.shape == (2, 2048) and labels.shape == (2, 2048)
    assert torch.equal(ids[:, 1:], labels[:, :-1])
    image = bench_configs.QWEN3_VL_TOKENS["image_token_id"]
    assert int((ids == image).sum()) == cfg.patches_per_microbatch()[0] // 4
    assert int((ids == bench_configs.QWEN3_VL_TOKENS["vision_start_token_id"]).sum()) == sum(
        map(len, cfg.image_sets[0])
    )
    assert not bool(((ids >= tiny.IMAGE_TOKEN_ID) & (ids < 1004)).any())  # no tiny special id left
    text = ids[(ids < bench_configs.QWEN3_VL_TEXT_END)]
    assert int(text.max()) > 100_000  # text spans the large vocabulary
    assert torch.equal(batch["loss_mask"], (labels != image).float())


@pytest.mark.parametrize(
    "make", [bench_configs.tiny_config, lambda: bench_configs.small_config(1, 2048)], ids=["tiny", "small"]
)
def test_variant_providers_finalize(make):
    cfg = make()
    eager = bench.variant_provider(cfg, "eager")
    eager.finalize()
    assert eager.cuda_graph_impl == "none" and not eager.cuda_graph.any_enabled
    ours = bench.variant_provider(cfg, "ours")
    ours.finalize()
    assert ours.cuda_graph_impl == "transformer_engine"
    assert ours.cuda_graph.vision.token_budgets == cfg.vision_budgets()
    assert ours.cuda_graph.on_capture_error == "raise"
    upstream = bench.variant_provider(cfg, "upstream")
    upstream.finalize()
    assert type(upstream).__name__ == "Qwen3VLModelProvider"
    assert upstream.cuda_graph_impl == "transformer_engine"
    assert upstream.vision_cuda_graph_impl == "transformer_engine"
    assert upstream.max_vision_cuda_graph_seq_length == cfg.vision_budgets()[-1]
    if cfg.model == "small":
        for p in (eager, ours, upstream):
            assert (p.num_layers, p.hidden_size, p.ffn_hidden_size, p.num_attention_heads) == (28, 2048, 6144, 16)
            assert (p.num_query_groups, p.kv_channels, p.vocab_size) == (8, 128, 151936)
            assert list(p.mrope_section) == [24, 20, 20] and p.image_token_id == 151655
            v = p.vision_config
            assert (v.depth, v.hidden_size, v.num_heads, v.intermediate_size) == (24, 1024, 16, 4096)
            assert (v.patch_size, v.spatial_merge_size, v.out_hidden_size) == (16, 2, 2048)
            assert list(v.deepstack_visual_indexes) == [5, 11, 17]


def _trace(kernels, windows):
    events = [{"ph": "X", "cat": "kernel", "ts": s, "dur": d, "args": {"stream": st}} for s, d, st in kernels]
    events += [
        {"ph": "X", "cat": "user_annotation", "name": f"bench_step_{j}", "ts": s, "dur": d}
        for j, (s, d) in enumerate(windows)
    ]
    events.append({"ph": "X", "cat": "gpu_user_annotation", "name": "bench_step_0", "ts": 0, "dur": 1e9})
    return {"traceEvents": events}


def test_kernel_time_per_step_unions_and_clips():
    kernels = [
        (100, 50, 7),  # step 0
        (120, 50, 7),  # overlaps the previous one: union 100..170 = 70
        (180, 10, 9),  # another stream
        (1e14, 5, 7),  # a corrupted off-clock record: ignored
        (1000, 400, 7),  # step 1
    ]
    trace = _trace(kernels, [(90, 200), (990, 1000)])
    out = bench_trace.kernel_time_per_step(trace, 2)
    assert out["kernel_ms"] == pytest.approx([0.080, 0.400])
    assert out["kernels"] == [3, 1]
    assert out["compute_stream"] == 7
    assert out["compute_stream_ms"] == pytest.approx([0.100, 0.400])  # stream sum (overlap counted twice)
    assert out["window_ms"] == pytest.approx([0.2, 1.0])
    with pytest.raises(RuntimeError, match="ranges"):
        bench_trace.kernel_time_per_step(trace, 3)


def test_union_length():
    assert bench_trace.union_length([]) == 0
    assert bench_trace.union_length([(0, 1), (0.5, 2), (3, 4), (3.5, 3.6)]) == pytest.approx(3.0)


def test_gpu_busy_summary_and_eager_fallback():
    profile = {"kernel_ms": [8.0, 9.0], "kernels": [100, 110], "compute_stream_ms": [8.0, 9.0], "window_ms": [12, 13]}
    by_key = {(0,): 10.0, (1,): 10.0}
    eager = bench_trace.gpu_busy_summary(profile, by_key, [(0,), (1,)])
    assert eager["gpu_busy"] == pytest.approx(17 / 20) and eager["gpu_busy_source"] == "profiler"
    assert eager["gpu_busy_in_profiled_steps"] == pytest.approx(17 / 25)
    graphed = {"kernel_ms": [0.5, 0.5], "kernels": [3, 3], "compute_stream_ms": [0.5, 0.5], "window_ms": [9, 9]}
    fast = {(0,): 9.0, (1,): 9.0}
    out = bench_trace.gpu_busy_summary(graphed, fast, [(0,), (1,)], eager_profile=profile, graphed=True)
    assert out["gpu_busy_source"] == "eager_kernel_time"
    assert out["gpu_busy"] == pytest.approx(17 / 18)
    assert "eager's kernel time" in out["gpu_busy_note"]
    seen = bench_trace.gpu_busy_summary(profile, fast, [(0,), (1,)], eager_profile=profile, graphed=True)
    assert seen["gpu_busy_source"] == "profiler" and seen["gpu_busy"] == pytest.approx(17 / 18)
    more = {**profile, "kernel_ms": [16.0, 17.0]}  # more work than eager (upstream's vision padding): kept
    padded = bench_trace.gpu_busy_summary(more, by_key, [(0,), (1,)], eager_profile=profile, graphed=True)
    assert padded["gpu_busy_source"] == "profiler" and padded["gpu_busy"] == pytest.approx(33 / 20)
    assert "exceeds the unprofiled step time" in padded["gpu_busy_note"]
    blind = bench_trace.gpu_busy_summary(
        profile, fast, [(0,), (1,)], eager_profile=profile, graphed=True, profiler_sees_graph_kernels=False
    )
    assert blind["gpu_busy_source"] == "eager_kernel_time"
    assert bench_trace.gpu_busy_summary(None, by_key, [(0,)])["gpu_busy"] is None


def test_step_plan_cycles():
    cfg = bench_configs.tiny_config()
    plan = bench.step_plan(cfg, 6)
    assert plan == [[0], [1], [2], [3], [0], [1]]
    assert bench.cycle_length(cfg) == 4


def test_clean_makes_json_safe():
    out = bench.json_safe({"a": float("nan"), 1: (1.0, math.inf), "b": {"c": [2.0]}})
    assert out == {"a": None, "1": [1.0, None], "b": {"c": [2.0]}}
    json.dumps(out, allow_nan=False)


def test_main_parses_arguments(monkeypatch, tmp_path):
    seen = {}

    def fake_run(configs, **kwargs):
        seen["configs"] = [c.name for c in configs]
        seen.update(kwargs)
        return {"configs": [{"name": "tiny", "variants": {"eager": {"status": "ok"}, "ours": {"status": "ok"}}}]}

    monkeypatch.setattr(bench, "run", fake_run)
    assert bench.main(["--out", str(tmp_path), "--quick", "--measured-steps", "31", "--no-profile"]) == 0
    assert seen["configs"] == ["tiny", "small-mbs1-seq2048"]
    assert seen["out_dir"] == str(tmp_path) and seen["measured_steps"] == 31 and seen["profile"] is False
    assert list(seen["variants"]) == ["eager", "upstream", "ours", "eager_repeat"]  # the control is on by default
    assert bench.main(["--out", str(tmp_path), "--configs", "tiny", "--no-control"]) == 0
    assert list(seen["variants"]) == ["eager", "upstream", "ours"]

    import argparse

    ns = argparse.Namespace(out=str(tmp_path), configs="tiny")  # a namespace with only some attributes
    assert bench.main(ns) == 0
    assert seen["configs"] == ["tiny"] and seen["measured_steps"] == 30 and seen["warmup_steps"] == 3


def test_main_fails_when_ours_fails(monkeypatch, tmp_path):
    monkeypatch.setattr(
        bench,
        "run",
        lambda configs, **kw: {"configs": [{"name": "tiny", "variants": {"ours": {"status": "failed"}}}]},
    )
    assert bench.main(["--out", str(tmp_path), "--configs", "tiny"]) == 1


def _timed(ms: float | None, status: str = "ok") -> dict:
    return {"status": status, "step_ms_median": ms}


@pytest.mark.parametrize(
    ("ours", "upstream", "repeat", "verdict"),
    [
        (90.0, 100.0, 101.0, "faster"),  # 1.11x, eager runs 1% apart
        (104.0, 100.0, 90.0, "within timing noise"),  # 0.96x, eager runs 10% apart
        (120.0, 100.0, 98.0, "slower"),
        (90.0, 100.0, None, None),  # no control: a ratio, no verdict
    ],
)
def test_speed_vs_upstream_is_judged_against_the_eager_runs_spread(ours, upstream, repeat, verdict):
    variants = {"eager": _timed(100.0), "upstream": _timed(upstream), "ours": _timed(ours)}
    if repeat is not None:
        variants[bench_report.CONTROL] = _timed(repeat)
    judged = bench_report.speed_vs_upstream(variants)
    assert judged["ratio"] == pytest.approx(upstream / ours)
    assert judged["verdict"] == verdict
    assert bench_report.speed_vs_upstream({**variants, "upstream": _timed(None, "failed")})["ratio"] is None


def _rounds(*medians: float) -> dict:
    first, *later = medians
    rec = {**_timed(first), "position": 1}
    rec["repeat_rounds"] = [{**_timed(m), "round": i + 2, "position": 4 + i} for i, m in enumerate(later)]
    return rec


@pytest.mark.parametrize(
    ("ours", "upstream", "verdict"),
    [
        ((90.0, 91.0), (100.0, 99.0), "faster"),  # 1.10x, each variant's rounds 1% apart
        ((98.0, 99.0), (100.0, 100.5), "faster"),  # 1.02x beyond a 1% spread, both pairs agree
        ((98.0, 102.0), (100.0, 101.0), "within timing noise"),  # 1.00x, ours' rounds 4% apart
        ((95.0, 101.0), (100.0, 100.0), "within timing noise"),  # 1.02x but the pairs disagree (1.05x, 0.99x)
        ((110.0, 111.0), (100.0, 100.0), "slower"),
    ],
)
def test_speed_vs_upstream_with_rounds_is_judged_against_their_own_spread(ours, upstream, verdict):
    # An eager pair 10% apart: with rounds, the eager runs no longer set the noise.
    variants = {"eager": _timed(100.0), bench_report.CONTROL: _timed(110.0)}
    variants.update(ours=_rounds(*ours), upstream=_rounds(*upstream))
    judged = bench_report.speed_vs_upstream(variants)
    assert judged["noise_source"] == "rounds" and judged["rounds"] == 2
    assert judged["ratio"] == pytest.approx(sum(upstream) / sum(ours))
    assert judged["pairs"] == pytest.approx([u / o for u, o in zip(upstream, ours, strict=True)])
    assert judged["timing_noise"] == pytest.approx(max((max(x) - min(x)) / (sum(x) / 2) for x in (ours, upstream)))
    assert judged["verdict"] == verdict


def test_a_failed_later_round_leaves_the_rounds_both_variants_finished():
    ours, upstream = _rounds(90.0, 91.0), _rounds(100.0, 99.0)
    upstream["repeat_rounds"][0]["status"] = "failed"
    judged = bench_report.speed_vs_upstream(
        {"eager": _timed(100.0), bench_report.CONTROL: _timed(101.0), "ours": ours, "upstream": upstream}
    )
    assert judged["rounds"] == 1 and judged["noise_source"] == "eager vs eager"
    assert judged["ratio"] == pytest.approx(100 / 90)


def test_rounds_note_lists_each_round_with_its_place_in_the_run_order():
    (line,) = bench_report._rounds_note({"ours": _rounds(90.0, 91.0), "upstream": _rounds(100.0, 99.0)})
    assert "upstream 100.0 (run 2), 99.0 (run 5); ours 90.0 (run 2), 91.0 (run 5)" in line


def test_leak_note_names_the_survivors_and_the_freed_memory():
    leak = {"survivors": ["model", "optimizer"], "holders": ["ChainedOptimizer <- cell"], "released_bytes": 2**31}
    (line,) = bench_report._leak_note("eager", leak)
    assert "model and optimizer outlived teardown" in line and "2.0 GiB freed" in line and "ChainedOptimizer" in line
    assert bench_report._leak_note("ours", None) == []


def test_graph_memory_per_submodule_note():
    capture = {
        "language": {"graph_memory_bytes": 2 * 2**20, "graphs": 4, "seconds": 1.5},
        "vision": {"graph_memory_bytes": 3 * 2**20, "graphs": 16, "seconds": 1.25},
    }
    config = {"name": "tiny", "variants": {"ours": {"status": "ok", "capture": capture}}}
    notes = bench_report._config_notes(config)
    assert (
        "- Ours, graph memory (MiB) and capture time per submodule: language 2 (4 graphs, 1.5 s), "
        "vision 3 (16 graphs, 1.2 s)."
    ) in notes


@pytest.mark.parametrize("folder", ["bench", "bench/full_2138", "bench/rounds_2121"])
def test_the_committed_report_is_what_the_renderer_makes_of_the_committed_json(tmp_path, folder):
    """results/padded-vs-upstream/bench/bench.md is rendered from its bench.json (the full matrix of 2026-11-29 22:34
    on two H200s), full_2138 from the one of 21:38 (before the budgets shared memory and the clones went), rounds_2121
    from the two-round run of 21:21; a renderer change that alters them must come with a re-render. The older two JSON
    files are stored gzipped (the device tool's size limit on the tree)."""
    import gzip

    path = tmp_path / "bench.json"
    stored = BENCH.parent / folder / "bench.json"
    if stored.exists():
        shutil.copy(stored, path)
    else:
        with gzip.open(stored.with_name("bench.json.gz"), "rb") as f:
            path.write_bytes(f.read())
    md = bench_report.render(path)["md"].read_text()
    assert md == (BENCH.parent / folder / "bench.md").read_text()
    expected = {
        "bench": "| small-mbs1-seq2048 | 416.4 | 164.3 (2.53x) | 173.3 (2.40x) | 0.998x: **within timing noise** "
        "(paired, 95% CI 0.979-1.046) |",
        "bench/full_2138": "| small-mbs1-seq2048 | 502.9 | 162.5 (3.09x) | 205.1 (2.45x) | 0.967x: **slower** "
        "(paired, 95% CI 0.951-0.986) |",
        "bench/rounds_2121": "| small-mbs2-seq4096 | 586.2 | 414.9 (1.41x) | 385.9 (1.52x) | 1.08x: **faster** (2 "
        "rounds: 1.075x, 1.080x; round-to-round ±0.4%) |",
    }[folder]
    assert expected in md


def test_paired_verdict_takes_the_wider_of_the_sign_test_and_the_block_bootstrap():
    # 30 pairs: the sign test's 95% interval is between the 10th and 21st smallest ratios.
    ratios = [1.0 + 0.01 * k for k in range(-5, 25)]  # ours faster in 24 of 30 pairs
    judged = bench_report.paired_verdict(ratios)
    assert judged["pairs"] == 30 and judged["ours_faster_pairs"] == 24
    assert judged["ci_sign_test"] == pytest.approx([sorted(ratios)[9], sorted(ratios)[20]])
    lo, hi = judged["ci"]
    assert lo == min(judged["ci_sign_test"][0], judged["ci_block_bootstrap"][0])
    assert hi == max(judged["ci_sign_test"][1], judged["ci_block_bootstrap"][1])
    assert lo <= judged["median"] <= hi
    assert judged["median"] == pytest.approx(statistics.median(ratios))
    assert judged["verdict"] == "faster"
    mixed = [1.0 + 0.01 * k for k in range(-15, 15)]
    assert bench_report.paired_verdict(mixed)["verdict"] == "within timing noise"
    assert bench_report.paired_verdict([1 / r for r in ratios])["verdict"] == "slower"
    few = bench_report.paired_verdict([1.2] * 5)  # P(all 5 on one side) = 1/16 > 2.5%: no 95% interval
    assert few["ci"] is None and few["verdict"] is None


def test_the_block_bootstrap_widens_the_interval_of_serially_correlated_pairs():
    """Ratios that drift over the run (the first half of the steps slow, the second fast, as when the host's
    state changes mid-run) carry less information than 30 independent pairs; pairs in shuffled order do not."""
    import random

    drift = [1.02 + 0.002 * (k % 5) for k in range(15)] + [1.06 + 0.002 * (k % 5) for k in range(15)]
    shuffled = drift[:]
    random.Random(3).shuffle(shuffled)
    width = lambda ci: ci[1] - ci[0]  # noqa: E731
    in_order = bench_report.block_bootstrap_ci(drift, block=5)
    independent = bench_report.block_bootstrap_ci(shuffled, block=1)
    assert width(in_order) > width(independent)
    assert bench_report.block_bootstrap_ci(drift) == bench_report.block_bootstrap_ci(drift)  # seeded
    assert bench_report.block_bootstrap_ci(drift[:5]) is None


def test_paired_phase_sets_the_summary_verdict_and_its_note():
    variants = {
        "eager": _timed(100.0),
        bench_report.CONTROL: _timed(110.0),
        "upstream": _timed(50.0),
        "ours": _timed(52.0),  # separate runs say 0.96x; the paired phase says otherwise
    }
    paired = {"status": "ok", "ratios": [1.02 + 0.001 * k for k in range(30)], "step_ms_median": {"upstream": 51.0}}
    judged = bench_report.speed_vs_upstream(variants, paired)
    assert judged["noise_source"] == "paired" and judged["verdict"] == "faster"
    config = {"name": "tiny", "status": "complete", "variants": variants, "paired": paired}
    lo, hi = bench_report.paired_verdict(paired["ratios"])["ci"]
    assert lo <= 1.029 and hi >= 1.040  # never narrower than the sign test's [r_(10), r_(21)]
    assert f"(paired, 95% CI {lo:.3f}-{hi:.3f})" in bench_report._summary_row(config)[4]
    (note,) = bench_report._paired_note(paired)
    assert "median step ms upstream 51.0, ours n/a" in note and "over 30 pairs (30 with ours faster): faster" in note
    skipped = {"status": "skipped", "reason": "too big"}
    assert bench_report._paired_note(skipped) == ["- Paired phase (upstream and ours side by side): skipped: too big."]
    assert bench_report.speed_vs_upstream(variants, skipped)["noise_source"] == "eager vs eager"
    assert bench_report.fmt_paired({"status": "ok", "ratios": []}) == "no pairs recorded"


def test_work_note_shows_who_runs_fewer_kernels_than_eager():
    variants = {
        "eager": {"status": "ok", "kernels_per_step": 6182.5, "kernel_ms_per_step": 117.0},
        "upstream": {"status": "ok", "kernels_per_step": 3978.25, "kernel_ms_per_step": 108.9},
        "ours": {"status": "failed"},
    }
    (note,) = bench_report._work_note(variants)
    assert "eager 6182 kernels / 117.0 ms, upstream 3978 kernels / 108.9 ms." in note
    assert bench_report._work_note({"eager": variants["eager"]}) == []


def test_limit_note_gives_step_time_over_kernel_time_and_busy_in_profile():
    variants = {
        "eager": {"status": "ok", "step_ms_median": 409.0, "kernel_ms_per_step": 117.0},
        "upstream": {"status": "failed"},
        "ours": {
            "status": "ok",
            "step_ms_median": 156.0,
            "kernel_ms_per_step": 119.0,
            "gpu_busy_in_profiled_steps": 0.66,
        },
    }
    (note,) = bench_report._limit_note(variants)
    assert note == (
        "- Step time over kernel time (the limit is 1.00x): eager 3.50x; ours 1.31x, busy 0.66 inside the profiled "
        "steps."
    )
    assert bench_report._limit_note({"ours": {"status": "ok", "step_ms_median": 1.0}}) == []


def test_limit_note_adds_the_paired_phase_median_over_the_same_kernel_time():
    """Run 51: the first round measured ours_fused at 148.8 ms, the paired phase of the same process at 127.9; both
    over the one kernel time the profiled steps gave. A variant without a kernel time (upstream failed, say) is left
    out of the paired part."""
    variants = {
        "upstream": {"status": "ok", "step_ms_median": 192.48, "kernel_ms_per_step": 108.59},
        "ours_fused": {"status": "ok", "step_ms_median": 148.79, "kernel_ms_per_step": 115.21},
    }
    paired = {"step_ms_median": {"upstream": 164.28, "ours_fused": 127.92}}
    (note,) = bench_report._limit_note(variants, paired)
    assert note.endswith(
        "ours_fused 1.29x. In the paired phase (median step over the same kernel time): upstream 164.3 ms, 1.51x; "
        "ours_fused 127.9 ms, 1.11x."
    ), note
    del variants["upstream"]["kernel_ms_per_step"]
    (note,) = bench_report._limit_note(variants, paired)
    assert note.endswith("(median step over the same kernel time): ours_fused 127.9 ms, 1.11x."), note
    (note,) = bench_report._limit_note(variants, {"status": "failed"})
    assert note.endswith("ours_fused 1.29x."), note


def test_targets_note_judges_issue_18s_three_targets_on_the_paired_variant():
    """Run 54's figures meet all three; run 51's first round misses two. No paired phase (or too few pairs for an
    interval): no line."""
    ratios = [1.44 + 0.01 * (i % 3) for i in range(30)]
    paired = {"status": "ok", "variants": ["upstream", "ours_fused"], "ratios": ratios}
    variants = {
        "ours_fused": {
            "status": "ok",
            "step_ms_median": 119.78,
            "kernel_ms_per_step": 114.68,
            "gpu_busy_in_profiled_steps": 0.92,
        }
    }
    (note,) = bench_report._targets_note(variants, paired)
    low = bench_report.paired_verdict(ratios)["ci"][0]
    assert note == (
        "- Issue #18's targets (set for micro-batch 1, sequence 2048), ours_fused: step over kernel time 1.044 "
        "(<= 1.1: met); GPU busy inside the profiled steps 0.920 (>= 0.9: met); paired against upstream, the "
        f"interval's low end {low:.3f} (>= 1.25: met)."
    )
    variants["ours_fused"].update(step_ms_median=148.79, kernel_ms_per_step=115.21, gpu_busy_in_profiled_steps=0.71)
    (note,) = bench_report._targets_note(variants, {**paired, "ratios": [r - 0.2 for r in ratios]})
    assert note.count("not met") == 3, note
    del variants["ours_fused"]["gpu_busy_in_profiled_steps"]
    (note,) = bench_report._targets_note(variants, paired)
    assert "GPU busy inside the profiled steps not measured" in note
    assert bench_report._targets_note(variants, {"status": "skipped", "reason": "memory"}) == []
    assert bench_report._targets_note(variants, {**paired, "ratios": ratios[:3]}) == []
