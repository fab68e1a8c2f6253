"""The GPT offline-packed full-iteration benchmark's CPU side: its command line, the order its variants run in (the
full-iteration graph after every other), its micro-batches (real rows from Bridge's offline packing, through
Bridge's ``gpt_step``, which megatron-core's static buffers must be able to carry), and its report."""

from __future__ import annotations

import json

import pytest
from _dist import run_world

from benchmarks import full_iteration as fi
from benchmarks import gpt_full_iteration as gfi
from benchmarks.schema import CONTROL, EAGER, FAILED, FULL_ITERATION, OK

SEQ = 512


# ------------------------------------------------------------------------------------------ command line


def test_arguments_and_defaults():
    args = gfi.parse_args(["--out", "x"])
    assert args.configs == ["tiny", "qwen3_8b_4l"] and args.variants == list(gfi.VARIANTS)
    assert (args.steps, args.warmup, args.profile_steps, args.cache) == (10, 3, 2, None)
    args = gfi.parse_args(["--out", "x", "--configs", "qwen3_8b_4l", "--steps", "4", "--warmup", "2"])
    assert args.configs == ["qwen3_8b_4l"] and (args.steps, args.warmup) == (4, 2)
    assert gfi.parse_args(["--out", "x", "--variants", "eager,upstream_full_iteration"]).variants == [
        EAGER,
        FULL_ITERATION,
    ]


@pytest.mark.parametrize(
    "argv",
    [
        [],  # --out is required
        ["--out", "x", "--configs", "tiny,huge"],
        ["--out", "x", "--configs", ""],
        ["--out", "x", "--variants", "eager,upstream"],  # bench's per-layer upstream is not a variant here
        ["--out", "x", "--warmup", "1"],  # the capture must follow an eager step
        ["--out", "x", "--steps", "0"],
    ],
)
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit):
        gfi.parse_args(argv)


def test_the_qwen3_8b_shape():
    cfg = gfi.CONFIGS["qwen3_8b_4l"]
    assert cfg.seq_length == 4096 and cfg.num_microbatches >= 2
    assert cfg.shape == {
        "num_layers": 4,
        "hidden_size": 4096,
        "ffn_hidden_size": 12288,
        "num_attention_heads": 32,
        "num_query_groups": 8,
        "kv_channels": 128,
        "qk_layernorm": True,
        "vocab_size": 151936,
        "rotary_base": 1e6,
    }
    assert gfi.CONFIGS["tiny"].seq_length == SEQ and gfi.CONFIGS["tiny"].shape == {}


# ------------------------------------------------------------------------------------------ order


def test_full_iteration_runs_after_every_other_variant_of_every_configuration():
    plan = gfi.process_plan(["tiny", "qwen3_8b_4l"], [FULL_ITERATION, CONTROL, "ours_packed", EAGER])
    assert plan == [
        ("tiny", EAGER),
        ("tiny", "ours_packed"),
        ("tiny", CONTROL),
        ("qwen3_8b_4l", EAGER),
        ("qwen3_8b_4l", "ours_packed"),
        ("qwen3_8b_4l", CONTROL),
        ("tiny", FULL_ITERATION),
        ("qwen3_8b_4l", FULL_ITERATION),
    ]
    # eager always first (the reference), even when not named
    assert gfi.process_plan(["tiny"], [FULL_ITERATION]) == [("tiny", EAGER), ("tiny", FULL_ITERATION)]
    with pytest.raises(ValueError, match="unknown variants"):
        gfi.process_plan(["tiny"], ["ours"])


def test_step_plan_uses_every_row_once():
    plan = gfi.step_plan(3, 4)
    assert plan == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


# ------------------------------------------------------------------------------------------ micro-batches


def _packed_steps(rank: int, world: int, cache: str) -> dict:
    import torch

    from bridge_cudagraph.examples.gpt_packed import packed_microbatches
    from bridge_cudagraph.parallel.groups import build_collections
    from bridge_cudagraph.parallel.layout import ParallelLayout

    # Bridge's get_batch copies the batch to the GPU (``.cuda(non_blocking=True)``); on the CPU that copy is the
    # identity, everything else is Bridge's step as it is.
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    pgc = build_collections(ParallelLayout(), None, world_size=world, backend="gloo")["language"]
    cfg = gfi.CONFIGS["tiny"]
    off = gfi.recipe_config(cfg, graphs=False, cache=cache)
    n = cfg.num_microbatches
    rows = packed_microbatches(4 * n, SEQ, cache=cache)
    batches = gfi.model_inputs(rows, off, pgc)
    steps = [[batches[k] for k in step] for step in gfi.step_plan(4, n)]
    from bridge_cudagraph.testing.step_batch import gpt_step_inputs

    unflat = [gpt_step_inputs(r, off, pgc) for r in rows]
    rebuilt = gfi.unflatten_packed(batches[1])
    params, ref = rebuilt["packed_seq_params"], unflat[1]["packed_seq_params"]
    return {
        "static": fi.static_input_mismatch(steps),
        "unflattened": fi.static_input_mismatch([[u] for u in unflat]),
        "keys": sorted(batches[0]),
        "types": sorted({type(v).__name__ for b in batches for v in b.values()}),
        "distinct_rows": len({tuple(b[gfi.PACKED_PREFIX + "cu_seqlens_q"].tolist()) for b in batches}),
        "rebuilt_equal": all(
            (torch.equal(a, b) if torch.is_tensor(a) else a == b)
            for a, b in ((getattr(params, f), getattr(ref, f)) for f in ("cu_seqlens_q", "max_seqlen_q", "qkv_format"))
        ),
        "rebuilt_keys": sorted(rebuilt),
        "shapes": sorted({tuple(b["input_ids"].shape) for b in batches}),
    }


def test_offline_packed_microbatches_are_static_for_the_full_iteration_graph(tmp_path):
    """Real rows of the tiny recipe, packed by Bridge on the CPU, through Bridge's gpt_step: flattened, every step
    passes megatron-core's static-buffer check; Bridge's own form (a PackedSeqParams object) would not."""
    (got,) = run_world(1, _packed_steps, str(tmp_path))
    assert got["static"] is None, got["static"]
    assert got["unflattened"] is not None and "PackedSeqParams" in got["unflattened"]
    assert "packed_seq_params" not in got["keys"] and gfi.PACKED_PREFIX + "cu_seqlens_q" in got["keys"]
    assert {"input_ids", "labels", "loss_mask", "position_ids"} <= set(got["keys"])
    assert set(got["types"]) <= {"Tensor", "int", "str", "NoneType"}, got["types"]
    assert got["distinct_rows"] > 4, "the rows should differ in their packing"
    assert got["rebuilt_equal"] and "packed_seq_params" in got["rebuilt_keys"]
    assert got["shapes"] == [(1, SEQ)]


def test_flatten_round_trip_without_packing():
    batch = {"input_ids": 1, "loss_mask": None}
    assert gfi.flatten_packed(batch) == batch and gfi.unflatten_packed(batch) == batch


# ------------------------------------------------------------------------------------------ report


def _record(**extra) -> dict:
    return {
        "status": OK,
        "step_ms": [10.0, 11.0, 12.0, 13.0, 30.0],
        "step_ms_median": 12.0,
        "kernel_ms_per_step": 9.0,
        "gpu_busy": 0.75,
        "peak_memory_bytes": 3 * 2**30,
        "peak_reserved_bytes": 4 * 2**30,
        "losses": [1.0, 2.0],
        **extra,
    }


def test_report_from_a_synthetic_record(tmp_path):
    data = {
        "meta": {"command": "python -m benchmarks.gpt_full_iteration --out x", "date": "2026-12-03", "gpu": None},
        "configs": [
            {
                "name": "tiny",
                "variants": {
                    EAGER: gfi.finish_record(_record(fixed_batch={"loss_mean": 2.0})),
                    "ours_packed": gfi.finish_record(
                        _record(
                            step_ms_median=6.0,
                            speedup_vs_eager=2.0,
                            capture_s=1.25,
                            graph_memory_bytes=64 * 2**20,
                            loss_max_abs_diff_vs_eager=0.0,
                            exact_steps=2,
                            fixed_batch={"loss_max_abs_diff": 0.0},
                        )
                    ),
                    FULL_ITERATION: {
                        "status": FAILED,
                        "error": "RuntimeError: capture failed | badly",
                        "cause": "RuntimeError: operation not permitted when stream is capturing",
                        "where": "megatron/core/x.py:12 in f",
                    },
                },
            }
        ],
    }
    assert data["configs"][0]["variants"][EAGER]["step_ms_iqr"] == pytest.approx(2.0)  # q1 11, q3 13
    gfi.write_results(data, tmp_path)
    saved = json.loads((tmp_path / "gpt_full_iteration.json").read_text())
    assert saved["meta"]["command"].startswith("python -m benchmarks.gpt_full_iteration")
    md = (tmp_path / "gpt_full_iteration.md").read_text()
    rows = {line.split(" | ")[1]: line for line in md.splitlines() if line.startswith("| tiny")}
    assert set(rows) == {EAGER, "ours_packed", FULL_ITERATION}
    assert "| 12.0 (2.00) |" in rows[EAGER] and "| reference | reference |" in rows[EAGER]
    assert "| 3.0 / 4.0 |" in rows[EAGER] and "| 9.00 | 0.75 |" in rows[EAGER]
    assert "| 2.00x |" in rows["ours_packed"] and "| 1.2 | 64 |" in rows["ours_packed"]
    assert "| 0 (exact) (2) | 0 (exact) |" in rows["ours_packed"]
    # a failure: its error, root cause and origin, and no '|' that would break the table
    assert "failed: RuntimeError: capture failed / badly" in rows[FULL_ITERATION]
    assert rows[FULL_ITERATION].count(" | ") == len(gfi.COLUMNS) - 1
    assert "root cause RuntimeError: operation not permitted" in md and "megatron/core/x.py:12" in md


def test_main_imports_nothing_of_the_gpu_path():
    """The module imports on a CPU-only machine without megatron or the plugin's GPU code."""
    import subprocess
    import sys

    code = (
        "import sys, benchmarks.gpt_full_iteration as m; "
        "print(sorted(k for k in sys.modules if k.startswith(('megatron', 'transformer_engine'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
