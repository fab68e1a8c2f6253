"""A useful-tokens run as :func:`benchmarks.useful_tokens.prepare` makes it, without data or GPU, for the CPU tests of
the benchmark's variants (MoE models, levers)."""

from __future__ import annotations

from benchmarks import useful_tokens
from benchmarks.configs import BenchConfig

#: The photo processor's token ids the providers are given (the tiny processor's).
IDS = {"image_token_id": 1000, "video_token_id": 1001, "vision_start_token_id": 1002, "vision_end_token_id": 1003}


def offline_run(model: str, *extra: str) -> useful_tokens.BenchRun:
    """A run of ``model`` with the command-line arguments ``extra``: two micro-batches of two photos each stand for
    the photo set's image grids."""
    args = useful_tokens.parse_args(["--out", "x", "--model", model, *extra])
    assert useful_tokens.check_args(args) is None
    cfg = BenchConfig(
        name=f"photo-{model}",
        model=model,
        seq_length=args.seq,
        micro_batch_size=args.mbs,
        image_sets=((((1, 40, 56),), ((1, 62, 48),)), (((1, 36, 64),), ((1, 44, 44),))),
        num_microbatches=args.num_mb,
    )
    layout = useful_tokens.derived_layout(args.seq, args.mbs)
    return useful_tokens.BenchRun(args=args, world=None, cfg=cfg, layout=layout, ids=dict(IDS), micro=[], shared={})
