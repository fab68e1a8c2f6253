"""Upstream's strongest option against ours on GPT offline-packed SFT: megatron-core's full-iteration graph
(``cuda_graph_impl="full_iteration"``, :mod:`benchmarks.full_iteration`) and this plugin's packed language graphs,
each against Bridge's eager packed (THD) step, on the rows Bridge's offline packing makes.

    python -m benchmarks.gpt_full_iteration --out results/gpt_full_iteration [--configs tiny,qwen3_8b_4l]
        [--steps 10] [--warmup 3] [--profile-steps 2]

Data: the pydoc SFT set of :mod:`bridge_cudagraph.examples.gpt_packed` (built offline), packed by Bridge's own
``GPTSFTDatasetConfig`` provider into rows of ``seq_length`` tokens with ``pad_to_max_length`` and
``offline_packing_specs.pad_cu_seqlens=True`` (the static shapes a full-iteration graph needs), micro-batch 1, each
row handed to the model through Bridge's ``gpt_step`` (``get_batch``, ``get_packed_seq_params``:
:func:`bridge_cudagraph.testing.step_batch.gpt_step_inputs`). megatron-core's static buffers copy tensors only and
hand any other object on as it is (the graph would replay the captured ``PackedSeqParams``' tensors), so every
variant's micro-batch carries the ``PackedSeqParams`` fields as plain entries (:func:`flatten_packed`) and its
forward step builds the object again from them (:func:`forward_step`): the same code path for every variant.

Variants, one process, the same initial weights and micro-batches, in this order (:func:`process_plan`):

* ``eager``: Bridge's unmodified ``GPTModelProvider`` (graphs off), megatron-core's schedule: the reference;
* ``ours_packed``: this plugin's packed language graphs from the recipe's plan (``recipes/tiny_gpt_packed.yaml``,
  as ``tests/gpu/test_packed_language.py`` builds them for GPT), with the step's host caches installed as the
  callback installs them;
* ``eager_repeat``: eager again, the run-to-run noise control;
* ``upstream_full_iteration``: Bridge's provider with ``cuda_graph_impl="full_iteration"``, megatron-core's
  ``FullCudaGraphWrapper`` around the schedule (:class:`benchmarks.full_iteration.FullIterationStep`). It runs after
  every other variant of every configuration: a failed capture leaves torch's CUDA generators registered with the
  abandoned graph, and nothing may run after it in the process. A refusal or failure is recorded (status, error,
  its root cause and where it came from), never raised.

Each variant: warmup steps (ours captures after them, full-iteration at the last of them), measured steps (median
and IQR of the wall time), profiled steps (kernel time per step and GPU busy, :mod:`benchmarks.bench_trace`), peak
memory allocated and reserved, capture seconds and graph memory, every step's loss against eager's (NaN/inf: the
variant fails), and the per-token loss of one fixed micro-batch from the initial weights against eager's (not for
the full-iteration graph, which replays whole steps only). The variant runner is :mod:`benchmarks.bench`'s
(``_run_variant`` with this module's ``build``).

Configurations: ``tiny`` (the examples' tiny GPT, sequence 512) and ``qwen3_8b_4l`` (Qwen3-8B's layer, hidden 4096,
FFN 12288, 32 heads, 8 query groups, head dim 128, QK layernorm, vocabulary 151936, RoPE base 1e6, at 4 layers;
sequence 4096), random weights, bf16, micro-batch 1, 4 micro-batches per step. Estimated wall time on one H200 for
both with the defaults: 2-3 minutes (imports and set-up ~40 s, the 8B shape's four builds ~40 s, its ~64 steps of
~0.3 s, profiles and captures).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.bench_report import fmt_bytes, fmt_diff, fmt_ms, fmt_ratio
from benchmarks.progress import say
from benchmarks.schema import CONTROL, EAGER, FAILED, FULL_ITERATION, OK, REFUSED, json_safe, write_json
from benchmarks.useful_tokens_report import step_time_stats

#: This plugin's packed language graphs.
OURS_PACKED = "ours_packed"
#: Every variant, in the order they run within a configuration.
VARIANTS = (EAGER, OURS_PACKED, CONTROL, FULL_ITERATION)
SEED = 1234
#: The prefix of a ``PackedSeqParams`` field carried as a plain micro-batch entry (:func:`flatten_packed`).
PACKED_PREFIX = "packed_seq_params."

#: Qwen3-8B's layer (its Hugging Face config) on the tiny provider's defaults (RMSNorm, SwiGLU, no biases, untied
#: embeddings, bf16).
QWEN3_8B_LAYER = dict(
    hidden_size=4096,
    ffn_hidden_size=12288,
    num_attention_heads=32,
    num_query_groups=8,
    kv_channels=128,
    qk_layernorm=True,
    vocab_size=151936,
    rotary_base=1_000_000.0,
)


@dataclass(frozen=True)
class GptConfig:
    """One configuration: the model (the tiny GPT provider's fields, ``shape`` over them) and its packed rows."""

    name: str
    seq_length: int
    num_microbatches: int = 4
    shape: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


CONFIGS = {
    "tiny": GptConfig("tiny", 512, description="the examples' tiny GPT (4 layers, hidden 512), sequence 512"),
    "qwen3_8b_4l": GptConfig(
        "qwen3_8b_4l",
        4096,
        shape=dict(QWEN3_8B_LAYER, num_layers=4),
        description="Qwen3-8B's layer shape at 4 layers, sequence 4096",
    ),
}


# ============================================================================================ order
def process_plan(configs: Sequence[str], variants: Iterable[str]) -> list[tuple[str, str]]:
    """``(configuration, variant)`` in the order they run: every configuration's variants in
    :func:`benchmarks.bench.run_order` (eager first, the control after ours), and the full-iteration variant of
    every configuration after all of them (nothing may run after a failed capture of it)."""
    from benchmarks.bench import run_order

    order = run_order(variants, known=VARIANTS)
    first = [(c, v) for c in configs for v in order if v != FULL_ITERATION]
    return first + [(c, FULL_ITERATION) for c in configs if FULL_ITERATION in order]


# ============================================================================================ micro-batches
def flatten_packed(inputs: dict[str, Any]) -> dict[str, Any]:
    """``inputs`` (the model's keyword arguments) with its ``PackedSeqParams`` as one plain entry per field
    (tensors, ints, strings, None): what megatron-core's static buffers carry."""
    out = {k: v for k, v in inputs.items() if k != "packed_seq_params"}
    params = inputs.get("packed_seq_params")
    if params is not None:
        out.update({PACKED_PREFIX + f.name: getattr(params, f.name) for f in dataclasses.fields(params)})
    return out


def unflatten_packed(batch: dict[str, Any]) -> dict[str, Any]:
    """:func:`flatten_packed` undone: the model's keyword arguments with a ``PackedSeqParams`` built from the
    entries (the static buffers' tensors, under a full-iteration graph)."""
    fields = {k[len(PACKED_PREFIX) :]: v for k, v in batch.items() if k.startswith(PACKED_PREFIX)}
    out = {k: v for k, v in batch.items() if not k.startswith(PACKED_PREFIX)}
    if fields:
        from megatron.core.packed_seq_params import PackedSeqParams

        out["packed_seq_params"] = PackedSeqParams(**fields)
    return out


def forward_step(data_iterator, model):
    """:func:`bridge_cudagraph.testing.parity`'s forward step on a flattened micro-batch."""
    from bridge_cudagraph.testing.parity import _forward_step

    return _forward_step(iter([unflatten_packed(next(data_iterator))]), model)


def with_forward_step(schedule: Callable[..., Any]) -> Callable[..., Any]:
    """``schedule`` (megatron-core's forward-backward function, or the full-iteration wrapper around it) called with
    :func:`forward_step`."""

    def run(**kwargs: Any) -> Any:
        return schedule(**{**kwargs, "forward_step_func": forward_step})

    return run


def recipe_config(cfg: GptConfig, *, graphs: bool, cache: str | None = None):
    """The tiny GPT packed recipe's ``ConfigContainer`` at ``cfg``'s shape and row length, ``cfg.num_microbatches``
    micro-batches per step, packed language graphs on or off; finalized as Bridge's set-up does."""
    from bridge_cudagraph.config import CudaGraphConfig, LanguageGraphConfig
    from bridge_cudagraph.examples.gpt_packed_recipe import tiny_gpt_packed_config
    from bridge_cudagraph.examples.tiny import tiny_gpt_provider
    from bridge_cudagraph.plan.from_config import finalize_config

    config = tiny_gpt_packed_config(seq_length=cfg.seq_length, cache=cache, seed=SEED)
    graphs_config = CudaGraphConfig(language=LanguageGraphConfig(enabled=graphs))
    config.model = tiny_gpt_provider(graphs_config, seq_length=cfg.seq_length, apply_rope_fusion=True, **cfg.shape)
    config.train.global_batch_size = cfg.num_microbatches
    finalize_config(config, world_size=1)
    return config


def model_inputs(rows: Sequence[dict], config: Any, pg_collection) -> list[dict[str, Any]]:
    """Collated packed rows as every variant's micro-batches: Bridge's ``gpt_step`` inputs, flattened."""
    from bridge_cudagraph.testing.step_batch import gpt_step_inputs

    return [flatten_packed(gpt_step_inputs(row, config, pg_collection)) for row in rows]


def step_plan(total_steps: int, num_microbatches: int) -> list[list[int]]:
    """Step ``i``'s micro-batches: the next ``num_microbatches`` rows (no row twice in a run)."""
    return [list(range(i * num_microbatches, (i + 1) * num_microbatches)) for i in range(total_steps)]


# ============================================================================================ variants
@dataclass
class _Config:
    """What the variants of one configuration build from."""

    cfg: GptConfig
    cache: str | None
    off: Any = None  # the graphs-off ConfigContainer (gpt_step's config)
    counters: dict = field(default_factory=dict)


def build_variant(state: _Config, shared: Any, variant: str, objs: dict) -> list:
    """``bench._Shared.build``: the variant's model, optimizer and schedule into ``objs``; its graph helpers."""
    import contextlib

    import torch
    from megatron.core.pipeline_parallel.schedules import get_forward_backward_func

    from benchmarks.bench import _load, _snapshot
    from benchmarks.full_iteration import FullIterationStep, capture_call
    from bridge_cudagraph.examples import tiny
    from bridge_cudagraph.testing.parity import megatron_optimizer, prepare_finalize

    world = shared.world
    pp = world.language.pp.size()
    if variant == OURS_PACKED:
        from bridge_cudagraph.plan.from_config import plan_config

        config = recipe_config(state.cfg, graphs=True, cache=state.cache)
        plan = plan_config(config, world_size=torch.distributed.get_world_size(), finalized=True)
        provider = config.model
    else:
        provider = tiny.upstream_provider(recipe_config(state.cfg, graphs=False, cache=state.cache).model)
        provider.cuda_graph_impl = "full_iteration" if variant == FULL_ITERATION else "none"
    objs["provider"] = provider
    model = objs["model"] = tiny.build(provider, world.language)
    if shared.initial_state is None:
        shared.initial_state = _snapshot(model)
    else:
        _load(model, shared.initial_state, aliases_allowed=False)
    optimizer = objs["optimizer"] = megatron_optimizer(model, world.language)
    if variant == FULL_ITERATION:
        objs["full_iteration"] = FullIterationStep(pp, capture_call(shared.warmup_steps))
        objs["schedule"] = with_forward_step(objs["full_iteration"])
        return []
    objs["schedule"] = with_forward_step(get_forward_backward_func(pp_size=pp))
    if variant != OURS_PACKED:
        return []
    from bridge_cudagraph.host import step as step_host  # as CudaGraphCallback.on_train_start installs it

    if plan.cached_walks.grad_finalize:
        prepare_finalize(model)
    installed = step_host.install_planned(plan, model, optimizer)
    objs.setdefault("exits", contextlib.ExitStack()).callback(step_host.uninstall, installed)
    return provider.make_graph_helpers(model, plan=plan, optimizers=[optimizer])


def prepare_config(cfg: GptConfig, world, args: argparse.Namespace, probe: dict | None):
    """The configuration's micro-batches on the GPU and bench's shared state for its variants."""
    from benchmarks.bench import _Shared
    from bridge_cudagraph.examples.gpt_packed import packed_microbatches
    from bridge_cudagraph.testing.step_batch import gpt_step_inputs

    state = _Config(cfg, args.cache)
    state.off = recipe_config(cfg, graphs=False, cache=args.cache)
    total = args.warmup + args.steps + args.profile_steps + 1  # + the host-sync census step
    rows = packed_microbatches(total * cfg.num_microbatches, cfg.seq_length, cache=args.cache)
    batches = model_inputs(rows, state.off, world.language)
    shared = _Shared(
        cfg=cfg,
        world=world,
        batches=batches,
        fixed_batch=gpt_step_inputs(rows[0], state.off, world.language),
        plan=step_plan(total, cfg.num_microbatches),
        warmup_steps=args.warmup,
        measured_steps=args.steps,
        profile_steps=args.profile_steps,
        profiler_sees_graph_kernels=None if probe is None else probe.get("sees_graph_kernels"),
        build=functools.partial(build_variant, state),
    )
    return shared, rows


def finish_record(rec: dict) -> dict:
    """Add the measured steps' quartiles (``step_ms_q1``/``_q3``/``_iqr``) to a variant's record."""
    if rec.get("step_ms"):
        rec.update(step_time_stats(rec["step_ms"]))
    return rec


# ============================================================================================ report
COLUMNS = (
    "config",
    "variant",
    "status",
    "step ms (median, IQR)",
    "vs eager",
    "kernel ms/step",
    "GPU busy",
    "peak alloc / reserved GiB",
    "capture s",
    "graph MiB",
    "loss max diff vs eager (exact steps)",
    "fixed batch per-token max diff",
)


def _row(config: str, name: str, rec: dict) -> list[str]:
    status = rec.get("status", "?")
    if status != OK:
        why = " ".join(str(rec.get(k)) for k in ("error", "cause", "where") if rec.get(k))
        return [config, name, f"{status}: {why[:300]}".replace("|", "/")] + ["-"] * (len(COLUMNS) - 3)
    fixed = rec.get("fixed_batch") or {}
    per_token = "n/a (whole steps only)" if fixed.get("skipped") else fmt_diff(fixed.get("loss_max_abs_diff"))
    if name == EAGER:
        loss, per_token = "reference", "reference"
    else:
        exact = rec.get("exact_steps")
        loss = fmt_diff(rec.get("loss_max_abs_diff_vs_eager")) + (f" ({exact})" if exact is not None else "")
    gib, mib = 2**30, 2**20
    memory = f"{fmt_bytes(rec.get('peak_memory_bytes'), gib)} / {fmt_bytes(rec.get('peak_reserved_bytes'), gib)}"
    return [
        config,
        name,
        status,
        f"{fmt_ms(rec.get('step_ms_median'))} ({fmt_ms(rec.get('step_ms_iqr'))})",
        fmt_ratio(rec.get("speedup_vs_eager"), "x"),
        fmt_ms(rec.get("kernel_ms_per_step")),
        fmt_ratio(rec.get("gpu_busy")),
        memory,
        "-" if rec.get("capture_s") is None else f"{rec['capture_s']:.1f}",
        fmt_bytes(rec.get("graph_memory_bytes"), mib, 0) if rec.get("graph_memory_bytes") is not None else "-",
        loss,
        per_token,
    ]


def render_markdown(data: dict) -> str:
    """The markdown report of a result (:func:`run`'s JSON)."""
    meta = data.get("meta", {})
    lines = [
        "# GPT offline-packed SFT: full-iteration graph vs packed language graphs",
        "",
        f"`{meta.get('command')}` on {meta.get('gpu') or 'no GPU'}, {meta.get('date')}; torch {meta.get('torch')}, "
        f"TE {meta.get('transformer_engine')}, megatron-core {meta.get('megatron_core')}, Megatron-Bridge "
        f"{meta.get('megatron_bridge')}. {meta.get('measured_steps')} measured steps after "
        f"{meta.get('warmup_steps')} warmup steps, {meta.get('profile_steps')} profiled.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for config in data.get("configs", []):
        for name, rec in config.get("variants", {}).items():
            lines.append("| " + " | ".join(_row(config["name"], name, rec)) + " |")
    lines += [
        "",
        "Loss differences: every step's loss against eager's; `n/a` where a loss was not finite (the variant then "
        "failed). The full-iteration graph has no fixed-batch check: it replays whole steps only.",
    ]
    for config in data.get("configs", []):
        for name, rec in config.get("variants", {}).items():
            if rec.get("status") in (FAILED, REFUSED):
                lines.append(f"- {config['name']} {name}: {rec.get('status')}: {rec.get('error')}")
                if rec.get("cause"):
                    lines.append(f"  root cause {rec['cause']} at {rec.get('where')}")
    return "\n".join(lines) + "\n"


def write_results(data: dict, out: Path) -> None:
    """``gpt_full_iteration.json`` and ``.md`` into ``out`` (the JSON replaced atomically)."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "gpt_full_iteration.json", data)
    (out / "gpt_full_iteration.md").write_text(render_markdown(data))


# ============================================================================================ run
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, checked (an unknown configuration or variant, or too few warmup steps, exits)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpt_full_iteration", description=__doc__.split("\n", maxsplit=1)[0]
    )
    parser.add_argument("--out", required=True, help="folder for gpt_full_iteration.json and .md")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--steps", type=int, default=10, help="measured steps per variant")
    parser.add_argument("--warmup", type=int, default=3, help="eager steps before the capture (at least 2)")
    parser.add_argument("--profile-steps", type=int, default=2, help="profiled steps per variant (0: none)")
    parser.add_argument("--cache", default=None, help="where the SFT set and Bridge's packed rows live")
    args = parser.parse_args(argv)
    args.configs = [c for c in args.configs.split(",") if c]
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown or not args.configs:
        parser.error(f"unknown configurations {unknown}; known: {', '.join(CONFIGS)}")
    try:
        process_plan(args.configs, args.variants)
    except ValueError as error:
        parser.error(str(error))
    if args.steps < 1 or args.warmup < 2 or args.profile_steps < 0:
        parser.error("need --steps >= 1, --warmup >= 2 (the capture follows an eager step) and --profile-steps >= 0")
    return args


def run(args: argparse.Namespace, command: str, world=None) -> dict:
    """Every ``(configuration, variant)`` of :func:`process_plan`; the result is rewritten after each."""
    import torch

    from benchmarks import bench

    if not torch.cuda.is_available():
        raise RuntimeError("the benchmark needs a CUDA GPU")
    if world is None:
        from bridge_cudagraph.testing.world import init_world

        world = init_world(seed=SEED)
    out = Path(args.out)
    probe = None
    if args.profile_steps:
        try:
            probe = bench.probe_profiler_sees_graph_kernels()
        except Exception as error:
            probe = {"error": f"{type(error).__name__}: {error}"[:500], "sees_graph_kernels": None}
    meta = bench._meta(measured_steps=args.steps, warmup_steps=args.warmup, probe=probe, command=command)
    meta.update(profile_steps=args.profile_steps, order=process_plan(args.configs, args.variants))
    data: dict[str, Any] = {"meta": meta, "configs": []}
    entries: dict[str, dict] = {}
    shared: dict[str, Any] = {}
    failed_capture: str | None = None
    for name, variant in process_plan(args.configs, args.variants):
        cfg = CONFIGS[name]
        if name not in entries:
            entries[name] = {**cfg.as_dict(), "status": "running", "variants": {}}
            data["configs"].append(entries[name])
            started = time.perf_counter()
            try:
                shared[name], rows = prepare_config(cfg, world, args, probe)
                entries[name]["rows"] = len(rows)
                entries[name]["data_s"] = time.perf_counter() - started
            except Exception as error:
                entries[name].update(status=FAILED, error=f"{type(error).__name__}: {error}"[:2000])
                say(f"{name}: data failed: {entries[name]['error']}")
        if name not in shared:
            continue
        say(f"{name} {variant}: start")
        state = shared[name]
        if variant != EAGER and state.eager_losses is None:
            entries[name]["variants"][variant] = {"status": FAILED, "error": "eager did not run: no reference"}
            continue
        rec = finish_record(bench._run_variant(state, variant))
        if variant == FULL_ITERATION and failed_capture:
            rec["after_failed_capture"] = failed_capture
        if variant == FULL_ITERATION and rec["status"] == FAILED:
            failed_capture = name
        if variant == EAGER and rec["status"] == OK:
            state.eager = rec
        entries[name]["variants"][variant] = rec
        bench._finish_variants(entries[name]["variants"])
        say(bench._summary_line(name, variant, rec))
        write_results(data, out)
    for entry in entries.values():
        if entry["status"] == "running":
            entry["status"] = "complete"
    write_results(data, out)
    print("\n" + "\n".join(line for line in render_markdown(data).splitlines() if line.startswith("|")), flush=True)
    return json_safe(data)


def main(argv: Sequence[str] | None = None) -> int:
    """Run and write the results; exit 1 when a variant other than the full-iteration graph did not finish (its
    refusal or failure is a result)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    data = run(args, shlex.join(["python", "-m", "benchmarks.gpt_full_iteration", *argv]))
    bad = [
        f"{c['name']} {v}"
        for c in data["configs"]
        for v, rec in c.get("variants", {}).items()
        if v != FULL_ITERATION and rec.get("status") != OK
    ]
    return 1 if bad or any(c.get("status") == FAILED for c in data["configs"]) else 0


if __name__ == "__main__":
    sys.exit(main())
