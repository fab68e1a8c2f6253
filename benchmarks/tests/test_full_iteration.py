"""The full-iteration variant's CPU side: what megatron-core's static buffers can carry, where a failure came from,
the variant's place in the command line and the run order, its provider, its wrapper's class-level state, the
refusal with its probe in the variant runner, and the report's rows and notes for a refused or failed run."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from benchmarks import bench, bench_report
from benchmarks import configs as bench_configs
from benchmarks import full_iteration as fi
from benchmarks.schema import FULL_ITERATION, REFUSED


def _batch(patches: int = 64, **extra) -> dict:
    return {
        "input_ids": torch.zeros(2, 16, dtype=torch.long),
        "pixel_values": torch.zeros(patches, 12),
        "attention_mask": None,
        **extra,
    }


# ------------------------------------------------------------------------------------------ static buffers


def test_static_input_mismatch_accepts_only_what_the_static_buffers_carry():
    assert fi.static_input_mismatch([]) is None
    assert fi.static_input_mismatch([[_batch(), _batch(32)], [_batch(), _batch(32)]]) is None
    why = fi.static_input_mismatch([[_batch(64)], [_batch(64)], [_batch(192)]])
    assert why == (
        "micro-batch 0 of step 2: pixel_values is torch.float32 [192, 12] where the static buffer holds "
        "torch.float32 [64, 12]"
    )
    # A smaller tensor that broadcasts would be copied without an error: refused all the same.
    assert "pixel_values" in fi.static_input_mismatch([[_batch(64)], [_batch(1)]])
    dtype = [[_batch()], [{**_batch(), "input_ids": torch.zeros(2, 16, dtype=torch.int32)}]]
    assert "input_ids is torch.int32" in fi.static_input_mismatch(dtype)
    assert "has 2 micro-batches where step 0 has 1" in fi.static_input_mismatch([[_batch()], [_batch(), _batch()]])
    assert "keys" in fi.static_input_mismatch([[_batch()], [_batch(extra=1)]])
    none_then_tensor = [[{**_batch(), "pixel_values": None}], [_batch()]]
    assert "do not copy" in fi.static_input_mismatch(none_then_tensor)
    assert "the graph replays step 0's" in fi.static_input_mismatch([[_batch(n=1)], [_batch(n=2)]])


def test_objects_the_static_buffers_hand_on_as_they_are_are_refused():
    """A ``PackedSeqParams`` is not copied into: the graph would replay the captured one's ``cu_seqlens``."""

    @dataclasses.dataclass
    class Params:
        cu_seqlens: torch.Tensor

    rows = [[_batch(params=Params(torch.tensor([0, 8, 16])))] for _ in range(2)]
    assert "params is Params" in fi.static_input_mismatch(rows)


def test_the_padded_qwen3_vl_data_is_refused_and_its_first_step_repeated_is_not():
    cfg = bench_configs.tiny_config()
    batches = [bench.make_batch(cfg, images, seed=i, device="cpu") for i, images in enumerate(cfg.image_sets)]
    plan = bench.step_plan(cfg, 6)
    why = fi.static_input_mismatch([[batches[k] for k in step] for step in plan])
    assert why is not None and why.startswith("micro-batch 0 of step 1: ")
    static = fi.static_plan(plan)
    assert static == [plan[0]] * 6 and fi.static_plan([]) == []
    assert fi.static_input_mismatch([[batches[k] for k in step] for step in static]) is None


def test_capture_call_is_the_last_warmup_step_and_never_the_first():
    assert [fi.capture_call(w) for w in (0, 1, 2, 3, 5)] == [1, 1, 1, 2, 4]


# ------------------------------------------------------------------------------------------ failures


def _fail_in_capture():
    try:
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")
    except RuntimeError:
        raise RuntimeError("CUDA error: operation failed due to a previous error during capture")  # noqa: B904


def test_error_origin_names_the_root_cause_and_its_innermost_frame():
    with pytest.raises(RuntimeError) as info:
        _fail_in_capture()
    out = fi.error_origin(info.value)
    assert out["cause"] == "RuntimeError: CUDA error: operation not permitted when stream is capturing"
    where = out["where"]
    assert where.startswith("benchmarks/tests/test_full_iteration.py:") and where.endswith(" in _fail_in_capture")
    assert fi.error_origin(ValueError("")) == {"cause": "ValueError: "}  # never raised: no frame


# ------------------------------------------------------------------------------------------ the variant


def test_the_variant_is_parsed_and_runs_after_every_other(monkeypatch, tmp_path):
    assert FULL_ITERATION == "upstream_full_iteration" and FULL_ITERATION in bench.VARIANTS
    chosen = bench.select_variants("eager,upstream,ours,upstream_full_iteration")
    assert chosen == ["eager", "upstream", "ours", FULL_ITERATION, "eager_repeat"]
    assert bench.run_order(chosen) == ["eager", "upstream", "ours", "eager_repeat", FULL_ITERATION]
    seen = {}

    def fake_run(configs, **kwargs):
        seen.update(kwargs)
        return {"configs": [{"name": "tiny", "variants": {FULL_ITERATION: {"status": REFUSED, "error": "no"}}}]}

    monkeypatch.setattr(bench, "run", fake_run)
    argv = ["--out", str(tmp_path), "--configs", "tiny", "--variants", "eager,upstream_full_iteration"]
    assert bench.main(argv) == 0  # a refused anchor does not fail the run
    assert list(seen["variants"]) == ["eager", FULL_ITERATION, "eager_repeat"]
    with pytest.raises(ValueError, match="unknown variants"):
        bench.run_order(["upstream_full_iterations"])
    data = {"configs": [{"name": "tiny", "variants": {FULL_ITERATION: {"status": REFUSED}, "ours": {"status": "x"}}}]}
    assert bench._failed_variants(data) == ["tiny/ours"]  # refused is an outcome, not a failure


def test_the_variant_provider_is_the_host_class_with_one_graph_per_step():
    cfg = bench_configs.tiny_config()
    provider = bench.variant_provider(cfg, FULL_ITERATION)
    provider.finalize()
    assert type(provider).__name__ == "Qwen3VLModelProvider"
    assert provider.cuda_graph_impl == "full_iteration" and not provider.cuda_graph_modules
    assert getattr(provider, "vision_cuda_graph_impl", "none") in (None, "none")
    assert bench.variant_provider(cfg, "upstream").cuda_graph_impl == "transformer_engine"


def test_the_wrapper_state_is_cleared_on_entry_and_on_close(monkeypatch):
    """megatron-core keeps the graph, its result, the call count and the static buffers on its classes: a second
    graph is refused while one is alive, and close leaves nothing behind, torch's stale-stream switch included."""
    from megatron.core.full_cuda_graph import FullCudaGraphWrapper, StaticBufferLoader

    monkeypatch.setattr(torch.cuda, "Stream", lambda *a, **k: object())  # StaticBufferLoader's copy stream
    torch.autograd.graph.set_override_stale_capture_stream(False)
    StaticBufferLoader.static_buffers["training"].append({"stale": torch.zeros(1)})
    FullCudaGraphWrapper.curr_iteration["training"] = 7
    step = fi.FullIterationStep(1, 2)
    assert step.wrapper.cuda_graph_warmup_steps == 2 and step.capture_at == 2
    assert FullCudaGraphWrapper.curr_iteration["training"] == 0
    assert StaticBufferLoader.static_buffers["training"] == [] and not step.captured()
    with pytest.raises(RuntimeError, match="no graph after 0 calls"):
        step.capture_record()
    FullCudaGraphWrapper.cuda_graph["training"] = object()  # a graph alive
    try:
        with pytest.raises(RuntimeError, match="another full-iteration graph"):
            fi.FullIterationStep(1, 2)
        assert step.captured()
        torch.autograd.graph.set_override_stale_capture_stream(True)  # what the wrapper's capture does
        StaticBufferLoader.static_buffers["training"].append({"x": torch.zeros(1)})
        step.close()
    finally:
        FullCudaGraphWrapper.cuda_graph["training"] = None
    assert FullCudaGraphWrapper.result["training"] is None and StaticBufferLoader.static_buffers["training"] == []
    assert torch._C._override_stale_capture_stream() is False


def test_a_refused_variant_is_never_built_and_its_probe_records_where_it_failed(monkeypatch):
    """Shapes that change between steps: refused before anything is built; then the probe runs the same variant on
    the first step's micro-batches (timed only) and records its failure with its cause and origin."""
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 0)
    monkeypatch.setattr("bridge_cudagraph.testing.world.seed_rng", lambda *a: None)
    builds = []

    def build(shared, variant, objs):
        builds.append(len({tuple(step) for step in shared.plan}))
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    monkeypatch.setattr(bench, "_build_variant", build)
    monkeypatch.setattr(bench, "say", lambda text: None)
    cfg = bench_configs.tiny_config()
    batches = [bench.make_batch(cfg, images, seed=i, device="cpu") for i, images in enumerate(cfg.image_sets)]
    shared = bench._Shared(
        cfg=cfg,
        world=type("World", (), {"language": None})(),  # never touched: the seeding is stubbed
        batches=batches,
        fixed_batch=batches[0],
        plan=bench.step_plan(cfg, 6),
        warmup_steps=3,
        measured_steps=2,
        profile_steps=1,
        profiler_sees_graph_kernels=None,
        flops_per_step=[float(i) for i in range(6)],
    )
    rec = bench._run_variant(shared, FULL_ITERATION)
    assert rec["status"] == REFUSED and rec["error"].startswith("megatron-core's static buffers cannot carry")
    assert builds == [1]  # only the probe was built, on one distinct step
    probe = rec["static_probe"]
    assert probe["status"] == "failed" and "static_probe" not in probe
    assert probe["cause"] == "RuntimeError: CUDA error: operation not permitted when stream is capturing"
    assert "benchmarks/tests/test_full_iteration.py" in probe["where"] and "in build" in probe["where"]
    assert fi.probe_shared(shared).flops_per_step == [0.0] * 6


# ------------------------------------------------------------------------------------------ the report


def _config(fi_record: dict) -> dict:
    ok = {"status": "ok", "step_ms_median": 100.0, "peak_memory_bytes": 2**30}
    return {
        "name": "tiny",
        "variants": {
            "eager": ok,
            "upstream": {**ok, "step_ms_median": 50.0, "speedup_vs_eager": 2.0},
            "ours": {**ok, "step_ms_median": 40.0, "speedup_vs_eager": 2.5},
            FULL_ITERATION: fi_record,
        },
    }


def test_the_report_shows_a_refused_anchor_with_its_reason_and_probe():
    refused = {
        "status": REFUSED,
        "error": "megatron-core's static buffers cannot carry this data: micro-batch 0 of step 1: pixel_values ...",
        "static_probe": {
            "status": "failed",
            "error": "RuntimeError: CUDA error: operation failed due to a previous error during capture",
            "cause": "RuntimeError: CUDA error: operation not permitted when stream is capturing",
            "where": "megatron/bridge/models/qwen_vl/modelling_qwen3_vl/model.py:154 in forward",
        },
    }
    md = bench_report.render_markdown({"meta": {}, "configs": [_config(refused)]})
    row = bench_report.variant_row(FULL_ITERATION, refused)
    assert row[1].startswith("refused: megatron-core's static buffers") and row[2:] == ["n/a"] * 8
    assert "| " + " | ".join(row) + " |" in md
    assert f"- {FULL_ITERATION} refused: megatron-core's static buffers cannot carry" in md
    assert (
        f"- {FULL_ITERATION} with the first step's micro-batches in every step (static shapes): failed: "
        "RuntimeError: CUDA error: operation failed due to a previous error during capture; cause: RuntimeError: "
        "CUDA error: operation not permitted when stream is capturing (at "
        "`megatron/bridge/models/qwen_vl/modelling_qwen3_vl/model.py:154 in forward`)."
    ) in md
    header = " | ".join(bench_report.summary_columns([FULL_ITERATION]))
    assert header.startswith("config | eager ms | upstream ms (speedup) | ours ms (speedup) | " + FULL_ITERATION)
    assert "| " + header + " |" in md
    assert "| tiny | 100.0 | 50.0 (2.00x) | 40.0 (2.50x) | refused | " in md


def test_the_report_shows_a_failed_anchor_where_it_failed_and_a_run_one_with_its_step_loss_parity():
    failed = {
        "status": "failed",
        "error": "AssertionError: check_for_nan_in_loss must be disabled",
        "cause": "AssertionError: check_for_nan_in_loss must be disabled",
        "where": "megatron/core/full_cuda_graph.py:210 in __call__",
    }
    md = bench_report.render_markdown({"meta": {}, "configs": [_config(failed)]})
    assert f"| {FULL_ITERATION} | failed: AssertionError: check_for_nan_in_loss must be disabled |" in md
    assert (
        f"- {FULL_ITERATION} failed: AssertionError: check_for_nan_in_loss must be disabled (at "
        "`megatron/core/full_cuda_graph.py:210 in __call__`)."
    ) in md
    assert "| tiny | 100.0 | 50.0 (2.00x) | 40.0 (2.50x) | failed | " in md
    ran = {
        "status": "ok",
        "step_ms_median": 25.0,
        "speedup_vs_eager": 4.0,
        "capture_s": 1.5,
        "graph_memory_bytes": 300 * 2**20,
        "peak_memory_bytes": 2**30,
        "loss_max_abs_diff_vs_eager": 0.0,
        "fixed_batch": {"skipped": "the full-iteration graph replays whole steps only"},
    }
    md = bench_report.render_markdown({"meta": {}, "configs": [_config(ran)]})
    assert f"| {FULL_ITERATION} | 25.0 | 4.00x | " in md and "| 1.50 | 1.0 | 300 | 0 (exact) | n/a |" in md
    assert "| tiny | 100.0 | 50.0 (2.00x) | 40.0 (2.50x) | 25.0 (4.00x) | " in md
    assert f"- {FULL_ITERATION}, fixed batch not checked (the full-iteration graph replays whole steps only)" in md
    assert bench_report.summary_extra([{"variants": {"ours": {}}}]) == []
