"""The useful-tokens benchmark's optional variants, CPU parts: their forms, references, run order and token slots;
the retired levers (answered in results/packed-2b-levers/ and results/padded-gradients/, no longer run) and the one
part of ours_padded that still runs; ``--paired``; and how the report reads them (the paired phase of another pair,
the host-wait census)."""

from __future__ import annotations

import itertools
import json

import pytest

from benchmarks import report, useful_tokens
from benchmarks.report import MicroBatch
from benchmarks.tests.useful_tokens_runs import offline_run

GIB = 2**30
BUDGETS = (1024, 2048, 3072, 4096, 5120, 6144, 7168, 8192)
LEVERS = "eager_packed,eager_padded,ours_padded,ours_padded_language,ours_packed"
#: The levers whose questions are answered: no longer run, refused on the command line, no provider.
RETIRED = (
    "eager_packed_fused",
    "ours_padded_layer_graphs",
    "ours_padded_megatron",
    "ours_padded_vision",
    "ours_packed_rows",
    "ours_packed_halvings",
    "ours_packed_bridge_packing",
    "ours_packed_autograd_grads",
    "ours_packed_device_grid",
    "ours_packed_fused",
)


@pytest.mark.fast
def test_the_optional_variants_forms_references_and_run_order():
    for name in (*report.PADDED_PARTS, report.PADDED_CONTROL):
        assert report.FORM[name] == report.PADDED and name in report.LABELS, name
        assert name not in report.VARIANTS  # opt-in: the default list is unchanged
    for name in report.PADDED_GRAPHED[1:]:  # ours_padded's parts: graphed, vs eager_padded
        assert name in report.GRAPHED and report.reference_of(name) == "eager_padded"
        assert report.ORDER.index("ours_padded") < report.ORDER.index(name) < report.ORDER.index("ours_packed")
    assert report.reference_of("ours_packed") == report.reference_of("eager_packed") == "eager_packed"
    assert report.reference_of("ours_padded") == "eager_padded"
    assert set(report.REFERENCES) == {"eager_packed", "eager_padded"}
    assert report.PACKED_GRAPHED == ("ours_packed",) and "eager_padded_repeat" not in report.GRAPHED
    # the eager ones first (each reference before the variants compared with it), the graphs after
    order = report.ORDER
    assert [v for v in order if v in report.VARIANTS] == list(report.VARIANTS)
    assert set(order) == {*report.VARIANTS, *report.PADDED_PARTS, report.PADDED_CONTROL}
    args = useful_tokens.parse_args(["--out", "x", "--variants", "ours_padded_language,eager_padded,eager_packed"])
    assert useful_tokens.check_args(args) is None
    assert useful_tokens.chosen_variants(args) == ("eager_packed", "eager_padded", "ours_padded_language")
    # the retired levers are no longer run: asking for one is refused before anything runs
    for retired in RETIRED:
        args = useful_tokens.parse_args(["--out", "x", "--variants", f"eager_packed,{retired}"])
        assert "the small model measures" in useful_tokens.check_args(args), retired
    # the defaults stay: dense models their five, MoE models theirs
    for model in ("tiny", "small"):
        plain = useful_tokens.parse_args(["--out", "x", "--model", model])
        assert useful_tokens.chosen_variants(plain) == report.VARIANTS
    moe = useful_tokens.parse_args(["--out", "x", "--model", "tiny-moe"])
    assert useful_tokens.chosen_variants(moe) == useful_tokens.MOE_VARIANTS


@pytest.mark.fast
def test_ours_packed_fills_the_budget_of_its_tight_tokens_or_of_its_rows():
    a = MicroBatch(rows=2, width=640, real_tokens=891, loss_tokens=254, packed_tokens=1280, padded_tokens=8192,
                   patches=1600, images=2, tight_tokens=912)  # fmt: skip
    assert report.token_slots("ours_packed", a, BUDGETS, 2, tight=True) == 1024  # T' = 912's rung
    # tight packing off (an MoE plan): T = 1280's rung
    assert report.token_slots("ours_packed", a, BUDGETS, 2) == 2048
    assert report.token_slots("eager_packed", a, BUDGETS, 2, tight=True) == 1280  # eager: T itself
    assert report.token_slots("ours_padded", a, BUDGETS, 2, tight=True) == 8192  # padded: rows x seq_length
    m = report.variant_metrics("ours_packed", [a], [[0]], [0], [100.0], budgets=BUDGETS, max_sequences=2)
    assert m["token_slots"] == 2048 and m["fill_fraction"] == pytest.approx(891 / 2048)


@pytest.mark.fast
def test_paired_and_the_lever_variants_on_the_command_line(capsys):
    cases = {
        # --paired names a variant this run does not measure
        ("--variants", "eager_packed,ours_packed", "--paired", "eager_packed,ours_packed_fused"): "--paired "
        "eager_packed,ours_packed_fused: name two different variants of this run (eager_packed,ours_packed)",
        ("--paired", "eager_packed"): "--paired eager_packed: name two different variants",
        ("--paired", "ours_packed,ours_packed"): "--paired ours_packed,ours_packed: name two different variants",
        ("--paired", "eager_packed,eager_packed_repeat"): "--paired eager_packed,eager_packed_repeat: name two",
        # the lever variants: dense models of the benchmark's own shape only
        ("--model", "tiny-moe", "--variants", "eager_packed,ours_packed_rows"): "--variants "
        "eager_packed,ours_packed_rows: the tiny-moe model measures",
        ("--variants", "eager_packed,ours_packed_fused"): "--variants eager_packed,ours_packed_fused: the small "
        "model measures",
        ("--variants", "ours_padded_language"): "include eager_packed, the reference of every packed variant",
    }
    for extra, expected in cases.items():
        assert useful_tokens.main(["--out", "x", *extra]) == 2, extra
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and expected in err[0], (extra, err)
    ok = useful_tokens.parse_args(["--out", "x", "--variants", LEVERS, "--paired", "ours_padded,ours_padded_language"])
    assert useful_tokens.check_args(ok) is None
    assert useful_tokens.paired_pair(ok) == ("ours_padded", "ours_padded_language")
    default = useful_tokens.parse_args(["--out", "x"])
    assert useful_tokens.check_args(default) is None and useful_tokens.paired_pair(default) == report.PAIRED
    # --no-paired: --paired is not checked (nothing will be paired)
    off = useful_tokens.parse_args(["--out", "x", "--variants", "eager_packed", "--no-paired", "--paired", "a,b"])
    assert useful_tokens.check_args(off) is None
    # the default pair where --variants leaves one out: skipped with the reason, as before --paired existed
    assert useful_tokens.paired_skip_reason({"eager_packed": {"status": "ok"}}, lambda: 1 << 40) == (
        "ours_packed was not run (--variants)"
    )


def _run(model: str = "tiny") -> useful_tokens.BenchRun:
    return offline_run(model, "--variants", LEVERS)


def test_the_retired_levers_have_no_provider_and_no_variant_fuses():
    """The levers whose questions are answered (results/packed-2b-levers/, results/padded-gradients/) are rendered
    from recorded runs, never built: no provider; every variant that runs trains without the fusion."""
    from bridge_cudagraph.bridge.mixin import provider_fields

    run = _run()
    runs = (*report.VARIANTS, *report.PADDED_PARTS, report.PADDED_CONTROL, report.CONTROL)
    got = {v: useful_tokens.variant_provider(run, v) for v in runs if v != "upstream_padded"}
    assert all(provider_fields(p)["gradient_accumulation_fusion"] is False for p in got.values())
    for retired in RETIRED:
        with pytest.raises(ValueError, match=f"no provider of '{retired}'"):
            useful_tokens.variant_provider(run, retired)
    assert useful_tokens.refusal(run, "ours_packed") is None


def test_ours_padded_parts_change_only_their_fields():
    """Each part of ours_padded (:data:`~benchmarks.report.PADDED_PARTS`) is ours_padded's block with the named fields
    replaced, nothing else: what tells which graphs a gradient difference comes from."""
    import dataclasses

    run = _run()
    base = useful_tokens.variant_provider(run, "ours_padded").cuda_graph
    for name, parts in report.PADDED_PARTS.items():
        block = useful_tokens.variant_provider(run, name).cuda_graph
        for sub in ("language", "vision", "forward", "cached_walks"):
            want = dataclasses.replace(getattr(base, sub), **parts.get(sub, {}))
            assert getattr(block, sub) == want, (name, sub)
        kept = {sub: getattr(base, sub) for sub in ("language", "vision", "forward", "cached_walks")}
        assert dataclasses.replace(block, **kept) == base, name
    assert not useful_tokens.variant_provider(run, "ours_padded_language").cuda_graph.vision.enabled


@pytest.mark.fast
def test_a_part_of_ours_padded_that_ran_and_failed_fails_the_run():
    # a part of ours_padded that was run and failed fails the run; one not run does not
    ok = {"status": "ok"}
    data = {"variants": {"eager_packed": ok, "ours_packed": ok, "ours_padded_language": {"status": "failed"}}}
    assert useful_tokens.failed_variants(data) == ["ours_padded_language"]
    assert useful_tokens.failed_variants({"variants": {"eager_packed": ok, "ours_packed": ok}}) == []


def _v(step_ms: float, kernel_ms: float | None, fill: float, peaks: tuple[float, float], **extra) -> dict:
    """A finished variant: 1000 useful tokens per step, so its tokens/s is 1e6 / step_ms."""
    return {
        "status": "ok",
        "form": "packed",
        "step_ms_median": step_ms,
        "step_ms_iqr": 3.0,
        "useful_tokens_per_s": 1e6 / step_ms,
        "kernel_ms_per_step": kernel_ms,
        "gpu_busy_source": None if kernel_ms is None else "profiler",
        "fill_fraction": fill,
        "peak_memory_bytes": peaks[0] * GIB,
        "peak_reserved_bytes": peaks[1] * GIB,
        **extra,
    }


def _levers(**changes) -> dict:
    padded = {"form": "padded"}
    variants = {
        "eager_packed": _v(1000.0, 600.0, 0.7, (40, 44), parity={"reference": "eager_packed"}),
        "eager_padded": _v(1100.0, 700.0, 0.3, (50, 54), **padded),
        "ours_padded": _v(900.0, 690.0, 0.3, (52, 56), **padded),
        "ours_padded_language": _v(950.0, 690.0, 0.3, (51, 55), **padded),
        "ours_packed": _v(1e6 / 1500, 400.0, 0.6, (31, 34)),
        report.CONTROL: _v(1020.0, None, 0.7, (40, 44)),  # its step 2.0% from eager_packed's: the noise floor
    }
    for name, rec in changes.items():
        if rec is None:
            del variants[name]
        else:
            variants[name] = rec
    return report.finish({"meta": {"config": {"model": "small"}}, "data": {}, "variants": variants})


@pytest.mark.fast
def test_the_table_shows_the_optional_variants_that_ran_in_run_order(tmp_path):
    data = _levers()
    assert report.shown(data) == [
        "eager_packed",
        "eager_padded",
        "upstream_padded",
        "ours_padded",
        "ours_padded_language",
        "ours_packed",
        report.CONTROL,
    ]
    path = tmp_path / "useful_tokens.json"
    path.write_text(json.dumps(data))
    out = report.render(path)
    assert "| ours_padded_language | 1,053 |" in out["md"].read_text()


@pytest.mark.fast
def test_a_paired_phase_of_another_pair_is_reported_as_that_pair_and_judges_no_target():
    data = _levers()
    data["paired"] = {
        "status": "ok",
        "variants": ["ours_padded", "ours_padded_language"],
        "ratios": [1.02] * 10,
        "peak_memory_bytes": 60 * 2**30,
        "peak_reserved_bytes": 64 * 2**30,
    }
    data = report.finish(data)
    summary = data["summary"]
    assert summary["paired"] is None and summary["met_on"] == "separate runs"  # not ours_packed vs eager_packed
    md = report.render_markdown(data)
    assert "**ours_packed vs eager_packed (useful tokens/s)**: separate runs 1.50x; not paired in this run." in md
    assert (
        "- **ours_padded_language vs ours_padded (useful tokens/s, `--paired`)**: paired (both models alive, steps "
        "interleaved) median per-pair ratio ours_padded ms / ours_padded_language ms 1.020x"
    ) in md
    assert "(10 with ours_padded_language faster)" in md
    assert "within-call 95% interval [" in md  # the spread it states is the one within this call
    assert "both models' peak 60.0 / 64.0 GiB allocated / reserved" in md  # memory next to the speed figure
    text = report.text_table(data)
    assert "ours_packed vs eager_packed (useful tokens/s): separate runs 1.50x; not paired in this run" in text
    assert "ours_padded_language vs ours_padded (useful tokens/s, `--paired`): paired" in text


@pytest.mark.fast
def test_the_host_waits_section_lists_each_census():
    data = _levers()
    data["variants"]["eager_packed"]["host_syncs"] = {"total": 9, "sites": [["bridge/x.py:10 f", 6]]}
    data["variants"]["ours_packed"]["host_syncs"] = {"total": 2, "sites": [["megatron/y.py:5 g", 2]]}
    data["variants"][report.CONTROL]["host_syncs_error"] = "RuntimeError: boom"
    lines = report.host_syncs_section(data)
    assert lines[:2] == ["## Host waits on the GPU (one training step)", ""]
    assert lines[2:5] == [
        "- eager_packed: 9 host waits on the GPU in one step; most from: 6 x `bridge/x.py:10 f`.",
        "- ours_packed: 2 host waits on the GPU in one step; most from: 2 x `megatron/y.py:5 g`.",
        "- eager_packed_repeat: census failed: RuntimeError: boom",
    ]
    assert "## Host waits on the GPU" in report.render_markdown(data)
    assert report.host_syncs_section(_levers()) == []
    assert set(report.HOST_SYNC_VARIANTS) == {"eager_packed", *report.PACKED_GRAPHED}


def test_ours_packed_vision_rungs_are_at_most_1_25x_apart():
    """ours_packed's vision ladder (not the former halvings, a retired lever): rungs at most 1.25x apart."""
    from bridge_cudagraph.bridge.mixin import provider_fields

    ours = provider_fields(useful_tokens.variant_provider(_run(), "ours_packed"))["cuda_graph"]
    rungs = ours.vision.token_budgets
    assert all(b / a <= 1.25 + 1e-9 for a, b in itertools.pairwise(rungs)), rungs


@pytest.mark.fast
def test_a_packed_variant_whose_ladders_did_not_sum_their_gradients_is_failed():
    """Each packed graph variant's ladders must sum its parameter gradients in graphs
    (useful_tokens.check_param_grads), else another step than ours_packed's would be timed under its name."""
    from benchmarks.useful_tokens import check_param_grads

    summed = {"language": {"param_grads_summed": 227}, "vision": {"param_grads_summed": 314}}
    check_param_grads("ours_packed", summed)
    check_param_grads("eager_packed", {})
    with pytest.raises(RuntimeError, match="ours_packed: parameter gradients summed"):
        check_param_grads("ours_packed", {**summed, "vision": {"param_grads_summed": 0}})


def test_packed_variants_are_planned_and_built_by_the_product():
    """ours_packed's helpers come from the product's plan of the variant's own provider (language packed on the run's
    ladder, vision, tight packing on, runs of layers between deepstack merges), as ``bridge-cudagraph train`` plans
    Bridge's Qwen3-VL step: nothing is constructed beside the plan."""
    run = _run()
    provider = useful_tokens.variant_provider(run, "ours_packed")
    plan = useful_tokens.packed_plan(run, provider)
    packed = plan.language.packed
    assert provider.cuda_graph.language.enabled and packed is not None
    assert packed.token_budgets == tuple(run.layout.budgets) and packed.tight
    assert plan.forward.flat_rows and plan.forward.collated_grids

    assert plan.language.graph_unit == "run" and plan.vision is not None and plan.vision.enabled
