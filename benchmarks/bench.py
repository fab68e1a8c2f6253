"""The benchmark: eager vs upstream's graphs vs ours, same model, weights and batches, one GPU.

For each configuration, in one process on one GPU under pure M4 process groups
(:func:`bridge_cudagraph.testing.world.init_world`), the same model is trained four ways, one after the other
(each variant freed before the next is built; the initial weights are kept as a CPU state dict):

1. ``eager``: graphs off (our provider with an empty ``cuda_graph`` block);
2. ``upstream``: the host provider with ``cuda_graph_impl="transformer_engine"`` and
   ``vision_cuda_graph_impl="transformer_engine"``, and the helpers built exactly as Megatron-Bridge 0.6.2's
   ``train()`` builds them (``train.py:268-303``): megatron-core's ``TECudaGraphHelper`` and
   ``VisionTECudaGraphHelper`` under the language collection, with Megatron's global micro-batch calculator;
3. ``ours``: :meth:`~bridge_cudagraph.bridge.mixin.CudaGraphProviderMixin.make_graph_helpers` (language + vision), and,
   where ``--variants`` names them, ours' speed levers (:data:`benchmarks.schema.OURS_VARIANTS`): ``ours_per_layer``
   (one vision graph per layer, the first version) and ``ours_optgraph`` (+ Bridge's optimizer graph);
   ``upstream_full_iteration`` (where ``--variants`` names it; :mod:`benchmarks.full_iteration`): the host
   provider with ``cuda_graph_impl="full_iteration"`` and the schedule wrapped in megatron-core's
   ``FullCudaGraphWrapper`` as Bridge's ``train()`` wraps it, one graph for the whole forward and backward, captured
   at the last warmup step. Where its static buffers cannot carry the configuration's data (micro-batches whose
   shapes change from step to step) it is recorded ``refused`` with the reason, and a probe runs it on the first
   step's micro-batches in every step (``static_probe``, timed only: what the wrapper does with the model once the
   shapes are static); a failure is recorded with its cause and where it came from;
4. ``eager_repeat`` (the control; ``--no-control`` skips it): eager again, built and run exactly like ``eager``
   (same provider, initial weights, batches and step plan), last, so it also runs in the process state the graphed
   variants left. Its differences from eager (every step's loss, the fixed batch, the grad norms) are the run-to-run
   noise floor, and :func:`benchmarks.bench_report.noise_floor_verdict` says whether a graphed variant's
   drift is within it (``vs_noise_floor``);
5. the paired phase (``--no-paired`` skips it): upstream and ours built side by side and captured, then their
   measured steps interleaved (step ``i`` on one, at once on the other, the first of each pair alternating), in the
   configuration's ``paired``; :func:`benchmarks.bench_report.speed_vs_upstream` judges ours vs upstream on
   the per-pair ratios (a distribution-free confidence interval of their median), since on a host-bound step
   the step times wander by 10-20% over seconds and separate runs cannot tell a few percent apart. It needs both
   models in memory at once (:func:`paired_memory_check`), else it is skipped with the reason;
6. optional timing rounds (``--rounds N``): ``ours`` then ``upstream`` again, each rebuilt, captured and timed
   (no profile or fixed batch), in ``repeat_rounds``, in the order A B, control, B A (:func:`run_plan`).

Each variant: build, load the initial weights, ``warmup_steps`` eager steps, capture (timed), ``measured_steps`` timed
training steps (Megatron's schedule + distributed optimizer, as :func:`~bridge_cudagraph.testing.parity.train_steps`),
a few profiled steps (the control runs them unprofiled): the GPU-busy fraction, and where the host time goes
(:class:`PhaseMarkers` put ``bcg_phase/*`` ranges around the step's phases for those steps only, and
:func:`~benchmarks.bench_trace.host_time_breakdown` attributes the GPU-idle time of the exported trace to
phases, CPU ops and CUDA runtime calls: ``host_time``); then a per-token-loss check on one fixed batch with the
initial weights copied back in. Results go to ``bench.json``, rewritten after every variant (a configuration in
progress is marked ``"status": "running"``, a finished one ``"complete"``);
:func:`benchmarks.bench_report.render` turns it into ``bench.md`` and ``bench.png`` (also on a machine without
a GPU).

Configurations are built in (:mod:`benchmarks.configs`: :func:`quick_configs`, :func:`full_configs`):

* ``tiny``: :mod:`bridge_cudagraph.examples.tiny`'s Qwen3-VL (4 + 4 layers), seq 256, micro-batch 2, four micro-batches
  of 1-8 images (the GPU tests' sets);
* ``small-mbs{1,2}-seq{2048,4096}``: a Qwen3-VL-2B-like model with the real shapes (language 28 x 2048, 16 heads,
  8 KV groups, FFN 6144, vocab 151936 with the real special token ids, mRoPE [24, 20, 20]; vision 24 x 1024,
  16 heads, FFN 4096, patch 16, merge 2, deepstack [5, 11, 17]), four micro-batches of 1-4 images of varied sizes
  per sample.

``--quick`` runs ``tiny`` and ``small-mbs1-seq2048``; the default runs the whole matrix.

Run (from the repository root): ``python -m benchmarks.bench --out results/bench [--quick] [--configs NAME,...]
[--no-control]``.

Several GPUs (the full matrix does not fit one 10-minute call on one GPU): ``--gpus N`` (or ``--devices 0,1``)
splits the configurations into N groups of balanced cost (:mod:`benchmarks.bench_gpus`: tokens per step
plus a fixed overhead, heaviest first into the lightest group) and starts one child process per GPU
(``CUDA_VISIBLE_DEVICES=<id>``, the same options, ``--configs <group>``, output and ``bench.log`` in
``OUT/part<i>-gpu<id>/``). Each configuration still runs all its variants in one process on one GPU. The parent
waits (``--time-limit SECONDS`` stops a child that runs longer), merges what the children wrote into
``OUT/bench.json`` (a configuration a child did not finish is marked ``failed``, or
``incomplete`` with the variants it did finish, with the child's exit status and its log's tail) and renders it.
``scripts/bench_two_gpus.sh`` runs the full matrix on two GPUs that way.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import gzip
import json
import logging
import math
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks import bench_gpus, bench_report
from benchmarks.bench_report import render
from benchmarks.bench_trace import (
    PHASE_PREFIX,
    STEP_MARK,
    gpu_busy_summary,
    host_time_breakdown,
    idle_by_python_function,
    kernel_time_per_step,
    top_kernels,
)
from benchmarks.configs import (
    DEFAULT_MEASURED_STEPS,
    DEFAULT_ROUNDS,
    DEFAULT_WARMUP_STEPS,
    MERGE,
    QWEN3_VL_TEXT_END,
    QWEN3_VL_TOKENS,
    QWEN3_VL_VOCAB,
    BenchConfig,
    configs_by_name,
    full_configs,
    quick_configs,
)
from benchmarks.flops import PEAK_BF16_TFLOPS
from benchmarks.full_iteration import (
    FULL_ITERATION,
    FullIterationStep,
    VariantRefused,
    capture_call,
    error_origin,
    probe_shared,
    static_input_mismatch,
)
from benchmarks.progress import say
from benchmarks.schema import (
    CONTROL,
    FAILED,
    FINISHED,
    OURS_VARIANTS,
    REFUSED,
    UNGRAPHED,
    UPSTREAM_VARIANTS,
    VARIANTS,
    command_line,
    is_ours,
    json_safe,
    write_json,
)

logger = logging.getLogger("benchmarks.bench")

#: What runs by default (the control is switched by ``--no-control``); ours' speed levers (the other names of
#: :data:`~benchmarks.schema.OURS_VARIANTS`) run when ``--variants`` names them.
MAIN_VARIANTS = ("eager", "upstream", "ours")
#: A configuration's variants when the caller names none: the main ones and the control.
DEFAULT_VARIANTS = (*MAIN_VARIANTS, CONTROL)
SEED = 1234


# ============================================================================================ models
def small_qwen3_vl_provider(cuda_graph=None, *, seq_length: int, **overrides: Any):
    """A Qwen3-VL-2B-like provider (real shapes and token ids, random weights) with our ``cuda_graph`` block: the
    tiny provider's settings (bf16, no dropout, SwiGLU, RMSNorm, QK-norm, mRoPE) with the 2B shapes.

    ``overrides`` replace any field, e.g. the special token ids of another tokenizer (the photo processor's)."""
    from bridge_cudagraph.examples import tiny

    deepstack = [5, 11, 17]
    vision = tiny.tiny_vision_config(
        2048,
        depth=24,
        hidden_size=1024,
        intermediate_size=4096,
        num_heads=16,
        num_position_embeddings=2304,
        deepstack_visual_indexes=list(deepstack),
    )
    fields = dict(
        vocab_size=QWEN3_VL_VOCAB,
        share_embeddings_and_output_weights=True,
        num_layers=28,
        hidden_size=2048,
        ffn_hidden_size=6144,
        num_attention_heads=16,
        num_query_groups=8,
        kv_channels=128,
        seq_length=seq_length,
        language_max_sequence_length=seq_length,
        mrope_section=[24, 20, 20],
        layernorm_epsilon=1e-6,
        vision_config=vision,
        spatial_merge_size=MERGE,
        num_position_embeddings=2304,
        out_hidden_size=2048,
        deepstack_visual_indexes=list(deepstack),
        **QWEN3_VL_TOKENS,
    )
    fields.update(overrides)
    return tiny.tiny_qwen3_vl_provider(cuda_graph, **fields)


def make_provider(cfg: BenchConfig, cuda_graph=None, **overrides: Any):
    """Our provider for ``cfg`` (graphs as ``cuda_graph`` says; None = off); ``overrides`` replace provider fields."""
    from bridge_cudagraph.examples import tiny

    if cfg.model == "tiny":
        return tiny.tiny_qwen3_vl_provider(
            cuda_graph, seq_length=cfg.seq_length, language_max_sequence_length=cfg.seq_length, **overrides
        )
    if cfg.model == "small":
        return small_qwen3_vl_provider(cuda_graph, seq_length=cfg.seq_length, **overrides)
    raise ValueError(f"unknown bench model {cfg.model!r}")


def ours_graph_config(
    cfg: BenchConfig,
    vision_graph_unit: str | None = None,
    cached_walks: dict[str, bool] | None = None,
    forward: dict[str, bool] | None = None,
    language_graph_unit: str | None = None,
):
    """Ours: language and vision graphs, budgets from the data, failures raised (never timed as eager);
    ``vision_graph_unit``, ``cached_walks``, ``forward`` and ``language_graph_unit`` as those settings of
    ``model.cuda_graph`` (None: the product's defaults)."""
    from bridge_cudagraph.config import (
        CachedWalksConfig,
        CudaGraphConfig,
        ForwardConfig,
        LanguageGraphConfig,
        VisionGraphConfig,
    )

    return CudaGraphConfig(
        language=LanguageGraphConfig(enabled=True, graph_unit=language_graph_unit),
        vision=VisionGraphConfig(
            enabled=True,
            token_budgets=cfg.vision_budgets(),
            max_images_per_microbatch=cfg.vision_max_segments(),
            graph_unit=vision_graph_unit,
        ),
        num_microbatches=cfg.num_microbatches,
        on_capture_error="raise",
        cached_walks=CachedWalksConfig(**(cached_walks or {})),
        forward=ForwardConfig(**(forward or {})),
    )


def variant_provider(cfg: BenchConfig, variant: str, **overrides: Any):
    """The provider of one variant (not finalized; :func:`bridge_cudagraph.examples.tiny.build` does that);
    ``overrides`` replace provider fields (as :func:`make_provider`)."""
    from bridge_cudagraph.examples import tiny

    if variant in UNGRAPHED:  # the control is built exactly like eager
        return make_provider(cfg, None, **overrides)
    if is_ours(variant):
        lever = OURS_VARIANTS[variant]
        graphs = ours_graph_config(
            cfg,
            lever.get("vision_graph_unit"),
            lever.get("cached_walks"),
            lever.get("forward"),
            lever.get("language_graph_unit"),
        )
        if "gradient_accumulation_fusion" in lever:
            overrides = {"gradient_accumulation_fusion": lever["gradient_accumulation_fusion"], **overrides}
        return make_provider(cfg, graphs, **overrides)
    if variant in UPSTREAM_VARIANTS:
        # the host class, with cuda_graph_impl="transformer_engine"
        plain = tiny.upstream_provider(make_provider(cfg, None, **overrides))
        if variant == FULL_ITERATION:
            # one graph of the whole step instead: the encoder is inside it, and per-layer graphs are refused with it
            plain.cuda_graph_impl = "full_iteration"
            return plain
        plain.vision_cuda_graph_impl = "transformer_engine"
        plain.max_vision_cuda_graph_seq_length = cfg.upstream_vision_seq_length()
        return plain
    raise ValueError(f"unknown variant {variant!r}; known: {VARIANTS}")


# ============================================================================================ data
def to_real_vocab(batch: dict, *, seed: int) -> dict:
    """Map a :func:`~bridge_cudagraph.examples.data.qwen3_vl_batch` (tiny ids, CPU tensors) onto Qwen3-VL's real
    vocabulary: special ids to the real ones, text to fresh random ids below the special range. Image positions,
    the loss mask, pixels and grids are unchanged."""
    from bridge_cudagraph.examples import tiny

    tokens = torch.cat([batch["input_ids"][:, :1], batch["labels"]], dim=1)
    g = torch.Generator().manual_seed(seed)
    out = torch.randint(0, QWEN3_VL_TEXT_END, tokens.shape, generator=g, dtype=tokens.dtype)
    specials = {
        tiny.IMAGE_TOKEN_ID: QWEN3_VL_TOKENS["image_token_id"],
        tiny.VIDEO_TOKEN_ID: QWEN3_VL_TOKENS["video_token_id"],
        tiny.VISION_START_TOKEN_ID: QWEN3_VL_TOKENS["vision_start_token_id"],
        tiny.VISION_END_TOKEN_ID: QWEN3_VL_TOKENS["vision_end_token_id"],
    }
    for tiny_id, real_id in specials.items():
        out[tokens == tiny_id] = real_id
    new = dict(batch)
    new["input_ids"] = out[:, :-1].contiguous()
    new["labels"] = out[:, 1:].contiguous()
    return new


def make_batch(cfg: BenchConfig, images, *, seed: int, device: str = "cuda") -> dict:
    """One micro-batch of ``cfg`` with ``images`` (per sample), on ``device``."""
    from bridge_cudagraph.examples.data import qwen3_vl_batch

    batch = qwen3_vl_batch([list(sample) for sample in images], cfg.seq_length, seed=seed, device="cpu")
    if cfg.model != "tiny":
        batch = to_real_vocab(batch, seed=seed + 7919)
    return {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in batch.items()}


def step_plan(cfg: BenchConfig, total_steps: int) -> list[list[int]]:
    """For each step, the indices (into ``cfg.image_sets``) of its micro-batches: the sets are cycled."""
    k, nm = len(cfg.image_sets), cfg.num_microbatches
    return [[(i * nm + j) % k for j in range(nm)] for i in range(total_steps)]


def cycle_length(cfg: BenchConfig) -> int:
    """Steps after which the micro-batch sequence repeats (the number of profiled steps)."""
    k, nm = len(cfg.image_sets), cfg.num_microbatches
    return k // math.gcd(k, nm)


# ============================================================================================ GPU helpers
def probe_profiler_sees_graph_kernels(kernels_per_graph: int = 16, replays: int = 3) -> dict:
    """Replay a CUDA graph of ``kernels_per_graph`` known elementwise kernels under ``torch.profiler`` and count
    the kernels it reports: does CUPTI/kineto see the kernels inside graph replays on this machine?"""
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(1 << 16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = x.mul(1.0001).add_(1.0)  # warm the kernels up off the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x
        for _ in range(kernels_per_graph // 2):
            y = y.mul(1.0001).add_(1.0)
    torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            _preroll()
            for j in range(replays):
                with torch.profiler.record_function(f"{STEP_MARK}{j}"):
                    graph.replay()
                    torch.cuda.synchronize()
        trace = _chrome_trace(prof, os.path.join(tmp, "probe.json"))
    counts = kernel_time_per_step(trace, replays)["kernels"]
    del graph
    expected = kernels_per_graph * replays
    return {"kernels_expected": expected, "kernels_seen": sum(counts), "sees_graph_kernels": sum(counts) >= expected}


def _chrome_trace(prof, path: str) -> dict:
    """``prof``'s chrome trace, exported to ``path`` (kept there for the caller) and read back."""
    prof.export_chrome_trace(path)
    with open(path) as f:
        return json.load(f)


def _preroll(n: int = 64) -> None:
    """Tiny kernels at the start of a profiling session, outside every step window: kineto's per-session CUPTI
    re-registration can corrupt the timestamps of a session's first kernel records."""
    t = torch.zeros(8, device="cuda")
    for _ in range(n):
        t.add_(1.0)
    torch.cuda.synchronize()


class VisionTimer:
    """CUDA events around every vision-encoder call of a model: forward (module pre/post hooks) and backward (from
    the gradient reaching the encoder's output to the gradient reaching its patch embedding's output).

    Records only while :attr:`active` and never during stream capture.
    """

    def __init__(self, model: Sequence[torch.nn.Module]) -> None:
        from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.vision_model import Qwen3VLVisionModel

        self.active = False
        self.records: list[dict[str, torch.cuda.Event]] = []
        self._current: dict | None = None
        self._handles = []
        self.encoders = [m for chunk in model for m in chunk.modules() if isinstance(m, Qwen3VLVisionModel)]
        for encoder in self.encoders:
            self._handles.append(encoder.register_forward_pre_hook(self._pre))
            self._handles.append(encoder.register_forward_hook(self._post))
            embed = getattr(encoder, "patch_embed", None)
            if embed is not None:
                self._handles.append(embed.register_forward_hook(self._embedded))

    @staticmethod
    def _event() -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _recording(self) -> bool:
        return self.active and not torch.cuda.is_current_stream_capturing()

    def _pre(self, module, args) -> None:
        if self._recording():
            self._current = {"fwd0": self._event()}

    def _embedded(self, module, args, output) -> None:
        record = self._current
        if record is None or not torch.is_tensor(output) or not output.requires_grad:
            return

        def on_grad(_grad, record=record):
            record["bwd1"] = self._event()

        output.register_hook(on_grad)

    def _post(self, module, args, output) -> None:
        record, self._current = self._current, None
        if record is None:
            return
        record["fwd1"] = self._event()
        main = output[0] if isinstance(output, tuple | list) else output
        if torch.is_tensor(main) and main.requires_grad:

            def on_grad(_grad, record=record):
                record["bwd0"] = self._event()

            main.register_hook(on_grad)
        self.records.append(record)

    def collect(self) -> list[tuple[float, float | None]]:
        """``(forward ms, backward ms or None)`` per recorded call since the last collect (synchronizes)."""
        torch.cuda.synchronize()
        out = []
        for r in self.records:
            fwd = r["fwd0"].elapsed_time(r["fwd1"])
            bwd = r["bwd0"].elapsed_time(r["bwd1"]) if "bwd0" in r and "bwd1" in r else None
            out.append((fwd, bwd))
        self.records = []
        return out

    def remove(self) -> None:
        """Remove every hook."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


def submodules_named(model: Sequence[torch.nn.Module], attribute: str) -> list[torch.nn.Module]:
    """Every distinct module that some submodule of ``model`` holds as ``attribute`` (Qwen3-VL's ``vision_model``
    and ``language_model``, whatever wraps the model: DDP, Float16Module, our rebuilt encoder)."""
    found: dict[int, torch.nn.Module] = {}
    for chunk in model:
        for module in chunk.modules():
            child = getattr(module, attribute, None)
            if isinstance(child, torch.nn.Module):
                found.setdefault(id(child), child)
    return list(found.values())


class PhaseMarkers:
    """``record_function`` ranges named ``bcg_phase/<phase>`` around the phases of a training step, so that
    :func:`host_time_breakdown` can say which phase the host was in while the GPU idled.

    Installed for the profiled steps only and removed after (:meth:`remove`): forward hooks on the model chunks,
    the vision encoders and the language models, tensor hooks for the vision backward, and a per-instance wrapper
    of ``optimizer.step``; nothing of :mod:`bridge_cudagraph.testing.parity`, the model's classes or the
    optimizer's class changes. Main-thread phases follow one another and cover the step: ``step_setup`` (from
    :meth:`start_step` to the first forward), ``forward``, ``backward`` (from a forward's end to the next forward or
    the optimizer step: loss, backward, gradient finalisation), ``optimizer_step``, ``step_end`` (until
    :meth:`end_step`). Nested: ``vision_forward`` and ``language_forward`` (module hooks) and ``vision_backward``
    (from the gradient reaching the encoder's output to the gradient reaching its patch embedding, on the autograd
    thread). Ranges are entered and exited by hand; ``record_function`` handles need not nest. Each marker is one
    host-side range per call, a few microseconds: cheap next to the ops the profiler records anyway.
    """

    SEQUENTIAL = ("step_setup", "forward", "backward", "optimizer_step", "step_end")

    def __init__(
        self,
        model: Sequence[torch.nn.Module],
        optimizer: Any = None,
        *,
        prefix: str = PHASE_PREFIX,
    ) -> None:
        self.prefix = prefix
        self._open: dict[str, Any] = {}
        self._current: str | None = None
        self._handles: list[Any] = []
        self._optimizer = optimizer
        self._had_step_attr = False
        self._old_step: Any = None
        for chunk in model:
            self._handles.append(chunk.register_forward_pre_hook(lambda *_: self.switch("forward")))
            self._handles.append(chunk.register_forward_hook(lambda *_: self.switch("backward")))
        for encoder in submodules_named(model, "vision_model"):
            self._handles.append(encoder.register_forward_pre_hook(lambda *_: self.open("vision_forward")))
            self._handles.append(encoder.register_forward_hook(self._vision_post))
            embed = getattr(encoder, "patch_embed", None)
            if isinstance(embed, torch.nn.Module):
                self._handles.append(embed.register_forward_hook(self._embedded))
        for language in submodules_named(model, "language_model"):
            self._handles.append(language.register_forward_pre_hook(lambda *_: self.open("language_forward")))
            self._handles.append(language.register_forward_hook(lambda *_: self.close("language_forward")))
        if optimizer is not None:
            self._wrap_step(optimizer)

    # ------------------------------------------------------------------------------ ranges
    def open(self, phase: str) -> None:
        """Enter ``bcg_phase/<phase>`` (an open one of the same name is closed first)."""
        self.close(phase)
        marker = torch.profiler.record_function(self.prefix + phase)
        marker.__enter__()
        self._open[phase] = marker

    def close(self, phase: str) -> None:
        """Exit ``bcg_phase/<phase>`` if it is open."""
        marker = self._open.pop(phase, None)
        if marker is not None:
            marker.__exit__(None, None, None)

    def switch(self, phase: str) -> None:
        """End the current main-thread phase and begin ``phase``."""
        if self._current is not None:
            self.close(self._current)
        self._current = phase
        self.open(phase)

    def start_step(self) -> None:
        """Call first thing in a profiled step."""
        self.switch("step_setup")

    def end_step(self) -> None:
        """Call last thing in a profiled step (after its synchronize): closes every range still open."""
        for phase in list(self._open):
            self.close(phase)
        self._current = None

    def remove(self) -> None:
        """Close every range, remove every hook and restore ``optimizer.step``."""
        self.end_step()
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._optimizer is not None:
            if self._had_step_attr:
                self._optimizer.step = self._old_step
            else:
                with contextlib.suppress(AttributeError):
                    del self._optimizer.step
            self._optimizer = None

    # ------------------------------------------------------------------------------ hooks
    def _wrap_step(self, optimizer: Any) -> None:
        self._had_step_attr = "step" in vars(optimizer)
        self._old_step = vars(optimizer).get("step")
        inner = optimizer.step

        def step(*args: Any, **kwargs: Any) -> Any:
            self.switch("optimizer_step")
            try:
                return inner(*args, **kwargs)
            finally:
                self.switch("step_end")

        optimizer.step = step

    def _vision_post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self.close("vision_forward")
        main = output[0] if isinstance(output, tuple | list) else output
        if torch.is_tensor(main) and main.requires_grad:
            main.register_hook(lambda _grad: self.open("vision_backward"))

    def _embedded(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if torch.is_tensor(output) and output.requires_grad:
            output.register_hook(lambda _grad: self.close("vision_backward"))


def _named_tensors(chunk: torch.nn.Module, *, remove_duplicate: bool = True) -> dict[str, torch.Tensor]:
    """A chunk's parameters and buffers by name: the tensors themselves, whatever ``state_dict`` makes of them
    (Bridge's LoRA ``AdapterWrapper.state_dict`` drops the ``to_wrap.`` its ``load_state_dict`` expects)."""
    out = dict(chunk.named_parameters(remove_duplicate=remove_duplicate))
    out.update(chunk.named_buffers(remove_duplicate=remove_duplicate))
    return out


def _snapshot(model) -> list[dict]:
    """Every parameter and buffer of the model chunks, on the CPU."""
    out = []
    for chunk in model:
        state = {}
        for key, value in _named_tensors(chunk).items():
            # Pinned: the copies back into each variant (twice per variant) are several GB for the small model.
            host = torch.empty(value.shape, dtype=value.dtype, device="cpu", pin_memory=value.is_cuda)
            state[key] = host.copy_(value.detach())
        out.append(state)
    return out


#: Names only a graphs-on upstream Qwen3-VL has: Bridge 0.6.2 registers the language model's decoder and rotary
#: embedding on the root too (DESIGN.md: 290 keys against 195); they alias the language model's tensors.
_UPSTREAM_ALIAS_KEY = re.compile(r"^(module\.)*(decoder|rotary_pos_emb)(\.|$)")


def _load(model, state: list[dict], *, aliases_allowed: bool) -> None:
    """Copy ``state`` (:func:`_snapshot`'s) into the model's tensors in place (captured graphs keep pointing at
    them). Every parameter of the model must be in ``state`` and the other way round, save upstream's aliases;
    a buffer the model made after the snapshot (a rotary table built at the first forward: run 27's
    ``vision_model.rotary_pos_emb.inv_freq``) is a function of the config and is left as it is."""
    for chunk, chunk_state in zip(model, state, strict=True):
        target = _named_tensors(chunk, remove_duplicate=False)
        params = {k for k, _ in chunk.named_parameters(remove_duplicate=False)}
        missing = [k for k in params - chunk_state.keys() if not (aliases_allowed and _UPSTREAM_ALIAS_KEY.match(k))]
        unexpected = sorted(chunk_state.keys() - target.keys())
        if missing or unexpected:
            raise RuntimeError(
                f"initial weights do not fit the model ({len(missing)} missing, {len(unexpected)} unexpected): "
                f"missing {sorted(missing)[:5]}, unexpected {unexpected[:5]}"
            )
        with torch.no_grad():
            for key, value in chunk_state.items():
                if target[key].shape != value.shape:
                    raise RuntimeError(
                        f"initial weights: {key} is {tuple(target[key].shape)}, not {tuple(value.shape)}"
                    )
                target[key].copy_(value)


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _train_step(
    model,
    optimizer,
    micro_batches: list[dict],
    pg_collection,
    grad_norms: list,
    forward_backward_func: Callable[..., Any] | None = None,
) -> tuple[float, float]:
    """One training step through :func:`bridge_cudagraph.testing.parity.train_steps` (its schedule run by
    ``forward_backward_func`` where given); ``(loss, wall ms)``."""
    from bridge_cudagraph.testing.parity import train_steps

    torch.cuda.synchronize()
    start = time.perf_counter()
    loss = train_steps(
        model,
        optimizer,
        [micro_batches],
        pg_collection=pg_collection,
        grad_norms=grad_norms,
        forward_backward_func=forward_backward_func,
    )[0]
    torch.cuda.synchronize()
    return loss, (time.perf_counter() - start) * 1e3


def _fixed_batch_check(model, batch: dict, *, keep_grads: bool = False) -> tuple[torch.Tensor, float, dict | None]:
    """Per-token loss (CPU, fp32), total gradient norm and, with ``keep_grads``, every trainable parameter's gradient
    (fp32, on the host: :func:`bridge_cudagraph.testing.parity.loss_and_grads`) of one forward/backward on ``batch``;
    gradient buffers are zeroed before and after."""
    from bridge_cudagraph.testing.parity import grad_norm, loss_and_grads

    loss, grads = loss_and_grads(model, batch, device="cpu")
    for chunk in model:
        chunk.zero_grad_buffer()
    return loss.cpu(), grad_norm(grads), grads if keep_grads else None


def non_finite_steps(values: Sequence[float] | None) -> list[int]:
    """The steps whose value is NaN, inf or missing."""
    return [i for i, v in enumerate(values or []) if v is None or not math.isfinite(v)]


class NonFiniteStepError(RuntimeError):
    """A variant's run had a NaN or infinite loss or grad norm: it is failed, never compared."""


def require_finite(losses: Sequence[float], grad_norms: Sequence[float] | None = None) -> None:
    """Raise :class:`NonFiniteStepError` when any step's loss or grad norm is not finite (the variant's record
    is then failed by :func:`_run_variant`, with what :func:`compare_steps` found)."""
    bad = {
        name: steps
        for name, steps in (("loss", non_finite_steps(losses)), ("grad norm", non_finite_steps(grad_norms)))
        if steps
    }
    if bad:
        raise NonFiniteStepError(
            "non-finite " + "; ".join(f"{name} at steps {steps[:10]}" for name, steps in bad.items())
        )


def compare_steps(
    losses: Sequence[float],
    reference: Sequence[float],
    *,
    grad_norms: Sequence[float] | None = None,
    reference_grad_norms: Sequence[float] | None = None,
    warmup_steps: int = 0,
) -> dict[str, Any]:
    """A variant's per-step losses (and grad norms) against eager's: the fields of its ``bench.json`` record.

    Python's ``max()`` skips NaN (``max([0.0, nan]) == 0.0``), so a run whose losses went NaN would read as
    identical. Here any non-finite loss or grad norm, on either side, leaves every difference ``None`` and names
    the steps in ``not_compared``; :func:`require_finite` then fails the variant."""
    out: dict[str, Any] = {}
    bad = {
        "losses": non_finite_steps(losses),
        "reference_losses": non_finite_steps(reference),
        "grad_norms": non_finite_steps(grad_norms),
        "reference_grad_norms": non_finite_steps(reference_grad_norms),
    }
    bad = {k: v for k, v in bad.items() if v}
    if len(losses) != len(reference):
        bad["length"] = [len(losses), len(reference)]
    if bad:
        out["not_compared"] = bad
        out.update(
            loss_abs_diff_per_step=None,
            loss_max_abs_diff_vs_eager=None,
            loss_max_abs_diff_after_capture=None,
            exact_steps=None,
        )
        return out
    diffs = [abs(a - b) for a, b in zip(losses, reference, strict=True)]
    out["loss_abs_diff_per_step"] = diffs
    out["loss_max_abs_diff_vs_eager"] = max(diffs) if diffs else None
    out["loss_max_abs_diff_after_capture"] = max(diffs[warmup_steps:], default=None)
    out["exact_steps"] = sum(d == 0 for d in diffs)
    if grad_norms and reference_grad_norms and len(grad_norms) == len(reference_grad_norms):
        out["grad_norm_max_rel_diff_vs_eager"] = max(
            abs(a - b) / max(abs(b), 1e-12) for a, b in zip(grad_norms, reference_grad_norms, strict=True)
        )
    return out


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


# ============================================================================================ one variant
@dataclass
class _Shared:
    """What the variants of one configuration share."""

    cfg: BenchConfig
    world: Any
    batches: list[dict]
    fixed_batch: dict
    plan: list[list[int]]
    warmup_steps: int
    measured_steps: int
    profile_steps: int
    profiler_sees_graph_kernels: bool | None
    initial_state: list[dict] | None = None
    eager: dict = field(default_factory=dict)
    eager_losses: list[float] | None = None
    eager_fixed_loss: torch.Tensor | None = None
    eager_fixed_grad_norm: float | None = None
    eager_profile: dict | None = None
    paired_with: str = "ours"
    lever_pairs: list[tuple[str, str]] = field(default_factory=list)
    flops_per_step: list[float] = field(default_factory=list)
    """Model FLOPs of every step of the plan (:mod:`benchmarks.flops`), for MFU."""
    trace_dir: str | None = None
    """``--profile-stacks``: profile with Python stacks, attribute the GPU-idle time to Python functions
    (:func:`~benchmarks.bench_trace.idle_by_python_function`) and keep each variant's trace here, gzipped."""


def _build_variant(shared: _Shared, variant: str, objs: dict) -> None:
    from bridge_cudagraph.examples import tiny
    from bridge_cudagraph.testing.parity import megatron_optimizer, optimizer_step_graph

    world = shared.world
    provider = variant_provider(shared.cfg, variant)
    objs["provider"] = provider
    if variant in UPSTREAM_VARIANTS:
        model = tiny.build(provider, world.language)
    else:
        model = tiny.build(provider, world.language, vision_pg_collection=world.vision)
    objs["model"] = model
    if OURS_VARIANTS.get(variant, {}).get("vision_position_cache") is False:
        from bridge_cudagraph.vision.encoder import GraphedQwen3VLVisionModel

        for encoder in (m for chunk in model for m in chunk.modules() if isinstance(m, GraphedQwen3VLVisionModel)):
            encoder.position_cache_size = 0
    if shared.initial_state is None:
        shared.initial_state = _snapshot(model)
    else:
        _load(model, shared.initial_state, aliases_allowed=variant in UPSTREAM_VARIANTS)
    optimizer_graph = bool(OURS_VARIANTS.get(variant, {}).get("optimizer_graph"))
    objs["optimizer"] = megatron_optimizer(model, world.language, optimizer_cuda_graph=optimizer_graph)
    if optimizer_graph:
        # Captured at the last warmup step, outside the timed steps (Bridge captures it at the step its layer
        # graphs are captured in); it needs the optimizer state of the steps before it.
        objs["exits"] = contextlib.ExitStack()
        capture_at = capture_call(shared.warmup_steps)
        objs["exits"].enter_context(optimizer_step_graph(objs["optimizer"], capture_at=capture_at))
    if variant == FULL_ITERATION:
        objs["full_iteration"] = FullIterationStep(world.language.pp.size(), capture_call(shared.warmup_steps))


def _make_helpers(shared: _Shared, variant: str, objs: dict, plan=None) -> list:
    """The variant's graph helpers; ours from ``plan`` (default: the provider's own for padded micro-batches)."""
    cfg, world = shared.cfg, shared.world
    model, optimizer, provider = objs["model"], objs["optimizer"], objs["provider"]
    if variant in UNGRAPHED or variant == FULL_ITERATION:  # the full-iteration graph is the schedule's wrapper
        return []
    if is_ours(variant):
        from bridge_cudagraph.testing.plans import plan_for

        if plan is None:
            plan = plan_for(
                provider,
                world_size=torch.distributed.get_world_size(),
                micro_batch_size=cfg.micro_batch_size,
                num_microbatches=cfg.num_microbatches,
            )
        from bridge_cudagraph.host import step as step_host  # as CudaGraphCallback.on_train_start installs it

        if plan.cached_walks.grad_finalize:
            from bridge_cudagraph.testing.parity import prepare_finalize

            prepare_finalize(model)  # the finalisation function Bridge's set-up gives the config
        installed = step_host.install_planned(plan, model, optimizer)
        off = OURS_VARIANTS[variant].get("forward_off", ())
        if off:  # the lever's mixins of model.cuda_graph.forward taken off alone (bridge_cudagraph.host.forward)
            from bridge_cudagraph.host import forward as forward_host

            forward_host.uninstall(installed.forward, off)  # raises where one of them is not on
        objs.setdefault("exits", contextlib.ExitStack()).callback(step_host.uninstall, installed)
        return provider.make_graph_helpers(model, plan=plan, optimizers=[optimizer])
    # Upstream, as Megatron-Bridge 0.6.2 train() builds its helpers (train.py:268-303), with the global
    # micro-batch calculator megatron-core's helpers read.
    from megatron.core.num_microbatches_calculator import (
        get_num_microbatches,
        init_num_microbatches_calculator,
    )
    from megatron.core.transformer.cuda_graphs import (
        TECudaGraphHelper,
        VisionTECudaGraphHelper,
        get_vision_cuda_graph_seq_length,
    )
    from megatron.core.utils import get_attr_wrapped_model, get_model_config

    from bridge_cudagraph.host import compat

    init_num_microbatches_calculator(
        0, None, cfg.micro_batch_size * cfg.num_microbatches, cfg.micro_batch_size, world.language.dp.size()
    )
    objs["calculator"] = True
    helpers = []
    model_config = get_model_config(model[0])
    if model_config.cuda_graph_impl == "transformer_engine":
        kwargs: dict[str, Any] = dict(
            model=model,
            config=model_config,
            seq_length=cfg.seq_length,
            micro_batch_size=cfg.micro_batch_size,
            optimizers=[optimizer],
        )
        if compat.helper_accepts_pg_collection():
            kwargs["pg_collection"] = world.language
        helpers.append(TECudaGraphHelper(**kwargs))
    if getattr(provider, "vision_cuda_graph_impl", None) == "transformer_engine":
        for chunk in model:
            unwrapped = get_attr_wrapped_model(chunk, "vision_model", allow_none=True, return_model_obj=True)
            if unwrapped is not None and getattr(unwrapped, "vision_model", None) is not None:
                vision_config = unwrapped.vision_model.config
                if vision_config.cuda_graph_impl == "transformer_engine":
                    vkwargs: dict[str, Any] = dict(
                        model=model,
                        vision_config=vision_config,
                        vision_seq_length=get_vision_cuda_graph_seq_length(vision_config),
                        micro_batch_size=cfg.micro_batch_size,
                        num_microbatches=get_num_microbatches(),
                    )
                    if compat.vision_helper_accepts_pg_collection():
                        vkwargs["pg_collection"] = world.language
                    helper = VisionTECudaGraphHelper(**vkwargs)
                    helper.bench_submodule = "vision"
                    helpers.append(helper)
                break
    return helpers


def capture_record(stats) -> dict[str, Any]:
    """What one helper's :class:`~bridge_cudagraph.capture.stats.CaptureStats` says about its capture and memory."""
    return {
        "seconds": stats.seconds,
        "graphs": stats.graphs,
        "layers": stats.layers,
        "graph_memory_bytes": stats.graph_memory_bytes,
        "per_budget": dict(stats.per_budget),
        "per_budget_live": dict(stats.per_budget_live),
        "budgets_captured": list(stats.budgets_captured),
        "budget_source": stats.budget_source,
        "late_captures": stats.late_captures,
        "above_captured": stats.above_captured,
        "param_grads_cloned": stats.param_grads_cloned,
        "param_grads_summed": stats.param_grads_summed,
    }


def growing(run_step: Callable[[int], float], helpers: list, record: dict) -> Callable[[int], float]:
    """``run_step`` with, before each step and untimed, the budgets a micro-batch above a ladder's captured top asked
    for captured (what the callback's lifecycle does in Bridge's loop, :meth:`GraphLifecycle.grow`); each growth is
    listed in ``record["late_captures"]`` with the caching allocator's reserved bytes before and after it (both after
    ``empty_cache``): a growth re-captures the ladder into a new pool, so it should cost the new pool less the one it
    replaces, and more says the old pool was not given back."""
    from bridge_cudagraph.capture.device_memory import held_reserved as reserved

    ladders = [h for h in helpers if hasattr(h, "capture_pending")]

    def run(i: int) -> float:
        for helper in ladders:
            if not helper.pending_budgets():
                continue
            pool_before, before = sum(helper.stats.per_budget.values()), reserved()
            rungs = helper.capture_pending()
            if rungs:
                record.setdefault("late_captures", []).append(
                    {
                        "step": i,
                        "submodule": helper.submodule,
                        "budgets": list(rungs),
                        "reserved_before_bytes": before,
                        "reserved_after_bytes": reserved(),
                        "pool_before_bytes": pool_before,
                        "pool_after_bytes": sum(helper.stats.per_budget.values()),
                    }
                )
        return run_step(i)

    return run


def _capture(variant: str, helpers: list) -> dict:
    """Capture every helper (as Bridge's loop does at the warmup step), measured like our own capture."""
    from bridge_cudagraph.capture.device_memory import measure
    from bridge_cudagraph.capture.failure import abandon_capture
    from bridge_cudagraph.capture.stats import CaptureStats

    total = CaptureStats("all")
    errors: dict[str, str] = {}
    with measure(total):
        for helper in helpers:
            upstream_vision = variant == "upstream" and getattr(helper, "bench_submodule", None) == "vision"
            try:
                helper.create_cudagraphs()
            except Exception as error:
                if not upstream_vision:
                    raise
                # Upstream's vision capture is not exercised by the GPU tests: if it fails, keep measuring
                # upstream's language graphs (vision then runs upstream's padded eager path) and say so.
                errors["vision"] = abandon_capture(helper.flattened_callables, helper.model, error, "upstream vision")
                gc.unfreeze()  # megatron-core's _start_capturing may have frozen the collector
                continue
            if upstream_vision:
                helper.cuda_graph_set_manual_hooks()  # train.py:449 (a no-op upstream)
    missing = [
        type(h).__name__ for h in helpers if not h.graphs_created() and getattr(h, "bench_submodule", "") not in errors
    ]
    if missing:
        raise RuntimeError(f"{variant}: no graphs after create_cudagraphs() for {missing}")
    out: dict[str, Any] = {"capture_s": total.seconds, "graph_memory_bytes": total.graph_memory_bytes}
    if errors:
        out["capture_errors"] = errors
    if is_ours(variant):
        out["capture"] = {h.submodule: capture_record(h.stats) for h in helpers}
        vision = [h for h in helpers if h.submodule == "vision"]
        if vision:
            out["vision_graph_memory_per_budget"] = dict(vision[0].stats.per_budget)
    return out


def _profile(
    shared: _Shared,
    run_step: Callable[[int], None],
    first_step: int,
    *,
    model=None,
    optimizer=None,
    label: str = "variant",
    stacks: bool = False,
) -> tuple[dict, dict]:
    """Profile ``shared.profile_steps`` steps from ``first_step``, with :class:`PhaseMarkers` on ``model`` and
    ``optimizer`` for those steps only; ``(kernel_time_per_step, host_time_breakdown or {"error": ...})``. With
    ``stacks`` (and ``shared.trace_dir``) the profile records Python stacks, the breakdown gains ``python`` (idle
    time by Python function) and the trace is kept as ``<trace_dir>/trace_<label>.json.gz``."""
    from torch.profiler import ProfilerActivity, profile

    n = shared.profile_steps
    markers = PhaseMarkers(model, optimizer) if model is not None else None
    stacks = stacks and shared.trace_dir is not None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=stacks) as prof:
                _preroll()
                for j in range(n):
                    with torch.profiler.record_function(f"{STEP_MARK}{j}"):
                        if markers is not None:
                            markers.start_step()
                        try:
                            run_step(first_step + j)
                            torch.cuda.synchronize()
                        finally:
                            if markers is not None:
                                markers.end_step()
            path = os.path.join(tmp, "trace.json")
            trace = _chrome_trace(prof, path)
            if stacks:
                os.makedirs(shared.trace_dir, exist_ok=True)
                kept = os.path.join(shared.trace_dir, f"trace_{label}.json.gz")
                with open(path, "rb") as f, gzip.open(kept, "wb") as g:
                    shutil.copyfileobj(f, g)
    finally:
        if markers is not None:
            markers.remove()
    kernels = kernel_time_per_step(trace, n)
    kernels["top_kernels"] = top_kernels(trace, n)
    try:
        host = host_time_breakdown(trace)
        if stacks:
            host["python"] = idle_by_python_function(trace)
    except Exception as error:  # an analysis aid: never a reason to lose the kernel times
        host = {"error": f"{type(error).__name__}: {error}"[:500]}
    return kernels, host


def _profile_cuda_only(shared: _Shared, run_step: Callable[[int], None], first_step: int) -> dict:
    """The profiled steps from ``first_step`` again, under a profiler that records CUDA kernels only: no CPU ops,
    no phase markers, no stacks. Recording every CPU op stretches a graphed step whose host work is many small
    calls (196 to 275 ms on the 2B packed step), so the busy fraction of :func:`_profile` reads the profiler's own
    host time as GPU idle; this one is close to the unprofiled step (:func:`~benchmarks.bench_trace.
    busy_between_marks`: its window is the steps' wall time, between two marker kernels)."""
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.bench_trace import busy_between_marks

    n = shared.profile_steps
    with tempfile.TemporaryDirectory() as tmp:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            _preroll()
            torch.cuda._sleep(1)
            for j in range(n):
                run_step(first_step + j)
                torch.cuda.synchronize()
            torch.cuda._sleep(1)
            torch.cuda.synchronize()
        trace = _chrome_trace(prof, os.path.join(tmp, "trace.json"))
    return busy_between_marks(trace, n)


def _run_variant(shared: _Shared, variant: str, *, timing_only: bool = False) -> dict:
    """Build, warm up, capture, time, profile and check one variant; always frees it. ``timing_only``: a later
    round, which stops after the measured steps (no vision timer, profile or fixed-batch check)."""
    rec: dict[str, Any] = {"status": "running"}
    objs: dict[str, Any] = {}
    started = time.perf_counter()
    _free()
    torch.cuda.reset_peak_memory_stats()
    # What an earlier variant left allocated (batches, and anything not freed) counts in this one's peak too.
    rec["allocated_at_start_bytes"] = torch.cuda.memory_allocated()
    from bridge_cudagraph.testing.world import seed_rng

    seed_rng(shared.world.language, SEED)
    try:
        _run_variant_body(shared, variant, rec, objs, timing_only=timing_only)
        rec["status"] = "ok"
    except VariantRefused as refusal:  # never built: nothing to time or compare
        rec.update(status=REFUSED, error=str(refusal))
        say(f"{shared.cfg.name} {variant}: REFUSED {rec['error'][:300]}")
    except Exception as error:  # recorded, the other variants still run
        _record_failure(rec, error, f"{shared.cfg.name} {variant}")
    finally:
        survivors = _teardown(objs)
    _check_freed(rec, survivors)
    if rec["status"] == REFUSED and variant == FULL_ITERATION and not timing_only:
        say(f"{shared.cfg.name} {variant}: probe on the first step's micro-batches in every step")
        rec["static_probe"] = _run_variant(probe_shared(shared), variant, timing_only=True)
    rec["seconds"] = time.perf_counter() - started
    return rec


def _record_failure(rec: dict, error: Exception, what: str) -> None:
    """Mark ``rec`` failed with the error and the tail of its traceback (call inside ``except``), and say so."""
    rec["status"] = FAILED
    rec["error"] = f"{type(error).__name__}: {error}"
    rec.update(error_origin(error))
    rec["traceback"] = traceback.format_exc()[-4000:]
    say(f"{what}: FAILED {rec['error'][:300]}")


#: Memory a deleted variant may leave allocated (its batches' share and allocator slack) before the benchmark
#: records who holds the rest (:func:`benchmarks.leaks.leak_report`).
LEAK_TOLERANCE_BYTES = 512 * 2**20


def _check_freed(rec: dict, survivors: dict) -> None:
    """Record what the deleted variant left allocated. If its model or optimizer outlived :func:`_teardown`
    (``survivors``), record who holds them, then free their storages; past :data:`LEAK_TOLERANCE_BYTES` without
    survivors, record who holds the largest tensors. A leaked model counts in every later variant's peak memory
    and can run the largest configuration out of it."""
    from benchmarks import leaks

    rec["left_allocated_bytes"] = left = torch.cuda.memory_allocated()
    try:
        if survivors:
            target = survivors.get("optimizer") or survivors["model"][0]
            # The survivors' own containers are not holders (without the list, a model's chain stopped at it).
            ignore = [survivors, *([survivors["model"]] if "model" in survivors else [])]
            rec["leak"] = {"survivors": sorted(survivors), "holders": leaks.holder_chains(target, ignore=ignore)}
        elif left - rec["allocated_at_start_bytes"] > LEAK_TOLERANCE_BYTES:
            rec["leak"] = leaks.leak_report()
    except Exception as error:  # a diagnosis aid, never a reason to lose the variant
        rec["leak"] = {"error": f"{type(error).__name__}: {error}"[:500]}
    if survivors:
        try:
            released = leaks.release_training_memory(survivors.get("model"), survivors.get("optimizer"))
            rec["leak"]["released_bytes"] = released
        except Exception as error:  # the next variant then starts with this memory taken, which its record shows
            rec["leak"]["release_error"] = f"{type(error).__name__}: {error}"[:500]
        survivors.clear()
        _free()
        rec["left_allocated_bytes"] = torch.cuda.memory_allocated()
    if "leak" in rec:
        say(f"variant left {left / 2**30:.1f} GiB allocated: {json.dumps(rec['leak'])[:3000]}")


def _run_variant_body(shared: _Shared, variant: str, rec: dict, objs: dict, *, timing_only: bool = False) -> None:
    cfg = shared.cfg
    if variant == FULL_ITERATION:
        why = static_input_mismatch([[shared.batches[k] for k in step] for step in shared.plan])
        if why is not None:
            raise VariantRefused(f"megatron-core's static buffers cannot carry this data: {why}")
    t0 = time.perf_counter()
    _build_variant(shared, variant, objs)
    helpers = _make_helpers(shared, variant, objs)
    rec["build_s"] = time.perf_counter() - t0
    model, optimizer = objs["model"], objs["optimizer"]
    objs["helpers"] = helpers
    timer = None if timing_only else VisionTimer(model)
    objs["timer"] = timer

    losses: list[float] = []
    grad_norms: list[float] = []
    times: list[float] = []
    vision: list[tuple[float, float | None]] = []

    run_step = _step_runner(shared, objs, losses=losses, grad_norms=grad_norms)
    warmup_ms = [run_step(i) for i in range(shared.warmup_steps)]
    if helpers:
        rec.update(_capture(variant, helpers))
    if "full_iteration" in objs:  # captured at the last warmup step, inside the wrapper
        rec.update(objs["full_iteration"].capture_record())
    if "capture_s" in rec:
        say(f"{cfg.name} {variant}: captured in {rec['capture_s']:.1f} s, {rec['graph_memory_bytes'] / 2**20:.0f} MiB")
    first = shared.warmup_steps
    if timer is not None:
        timer.active = True
    for i in range(first, first + shared.measured_steps):
        times.append(run_step(i))
        if timer is not None:
            vision.extend(timer.collect())
    if timer is not None:
        timer.active = False
    rec["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
    rec["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    rec.update(_throughput(shared, range(first, first + shared.measured_steps), times))
    if timing_only:
        rec["step_ms"] = times
        rec["step_ms_median"] = _median(times)
        rec["losses"] = losses
        _record_counters(rec, variant, helpers)
        require_finite(losses, grad_norms)
        return

    # Unprofiled median wall time per distinct step (same micro-batches), the GPU-busy denominators.
    keys = [tuple(shared.plan[i]) for i in range(first, first + shared.measured_steps)]
    by_key: dict[Any, list[float]] = {}
    for key, ms in zip(keys, times, strict=True):
        by_key.setdefault(key, []).append(ms)
    step_ms_by_key = {k: statistics.median(v) for k, v in by_key.items()}

    profile = None
    p_first = first + shared.measured_steps
    if shared.profile_steps and variant == CONTROL:
        # The control's step time and losses are what it is for; its steps run unprofiled (no trace to analyse).
        for i in range(p_first, p_first + shared.profile_steps):
            run_step(i)
    elif shared.profile_steps:
        try:
            profile, rec["host_time"] = _profile(
                shared,
                run_step,
                p_first,
                model=model,
                optimizer=optimizer,
                label=f"{shared.cfg.name}_{variant}",
                stacks=variant not in UNGRAPHED,  # eager's Python under the profiler's stacks: a trace too large
            )
        except Exception as error:  # the profiler is a measurement aid, never a reason to lose the timings
            rec["profile_error"] = f"{type(error).__name__}: {error}"[:500]
            say(f"{cfg.name} {variant}: profiling failed: {rec['profile_error']}")
            # keep the step sequence identical across variants: run the steps the profiler would have run
            done = len(losses) - p_first
            for i in range(p_first + max(0, done), p_first + shared.profile_steps):
                run_step(i)
    profiled_keys = [tuple(shared.plan[i]) for i in range(p_first, p_first + shared.profile_steps)]

    rec["step_ms"] = times
    rec["warmup_step_ms"] = warmup_ms
    rec["step_ms_median"] = _median(times)
    rec["step_ms_mean"] = statistics.fmean(times) if times else None
    rec["step_ms_min"] = min(times) if times else None
    rec["step_ms_max"] = max(times) if times else None
    rec["step_ms_by_microbatches"] = {"+".join(map(str, k)): v for k, v in step_ms_by_key.items()}
    rec["losses"] = losses
    rec["grad_norms"] = grad_norms
    fwd = [f for f, _ in vision]
    bwd = [b for _, b in vision if b is not None]
    both = [f + b for f, b in vision if b is not None]
    rec["vision_calls"] = len(vision)
    rec["vision_fwd_ms"] = _median(fwd)
    rec["vision_bwd_ms"] = _median(bwd)
    rec["vision_ms"] = _median(both) if both else rec["vision_fwd_ms"]
    rec["vision_microbatches_per_step"] = len(vision) / max(1, shared.measured_steps)

    if variant == "eager":
        shared.eager_profile = profile
    rec.update(
        gpu_busy_summary(
            profile,
            step_ms_by_key,
            profiled_keys,
            eager_profile=shared.eager_profile,
            graphed=variant not in UNGRAPHED,
            profiler_sees_graph_kernels=shared.profiler_sees_graph_kernels,
            fallback_step_ms=rec["step_ms_median"],
        )
    )
    if profile is not None:
        rec["profile"] = profile
    kernel_ms = rec.get("kernel_ms_per_step")
    if kernel_ms and shared.flops_per_step:
        from benchmarks.flops import mfu

        profiled = [shared.flops_per_step[i] for i in range(p_first, p_first + shared.profile_steps)]
        # The MFU the step would reach if the GPU never waited for the host: the graphs' limit.
        rec["mfu_at_kernel_time"] = (
            mfu(statistics.fmean(profiled), kernel_ms, rec.get("peak_tflops")) if profiled else None
        )

    if variant == "eager":
        shared.eager_losses = losses
    if variant != "eager" and shared.eager_losses is not None:
        rec.update(
            compare_steps(
                losses,
                shared.eager_losses,
                grad_norms=grad_norms,
                reference_grad_norms=shared.eager.get("grad_norms"),
                warmup_steps=shared.warmup_steps,
            )
        )
    if variant == FULL_ITERATION:
        # Its graph holds a whole training step on its static buffers: a forward of the model on the fixed batch
        # would run eagerly and compare eager with eager. Its parity is the per-step losses above.
        rec["fixed_batch"] = {"skipped": "the full-iteration graph replays whole steps only"}
    else:
        rec["fixed_batch"] = _fixed_batch_record(shared, variant, model, helpers)
    _record_counters(rec, variant, helpers)
    require_finite(losses, grad_norms)
    if variant != CONTROL:
        # Last, so the compared losses are untouched: one more step, where the host waits for the GPU.
        from benchmarks.host_syncs import census

        # Any step's micro-batches will do: the first profiled step's, or the last measured one's without a profile.
        # A runner of its own, so the step's loss and grad norm join no recorded series (eager's is the reference).
        census_step = _step_runner(shared, objs)
        rec["host_syncs"] = census(lambda: census_step(min(p_first, len(shared.plan) - 1)))


def _fixed_batch_record(shared: _Shared, variant: str, model: list, helpers: list) -> dict[str, Any]:
    """The fixed batch's per-token loss and grad norm with the initial weights copied back in (in place: the graphs
    stay valid); eager's are kept as the reference, every other variant's record has its difference from them."""
    _load(model, shared.initial_state, aliases_allowed=variant in UPSTREAM_VARIANTS)
    vision_helper = next((h for h in helpers if getattr(h, "submodule", None) == "vision"), None)
    replays_before = vision_helper.stats.replays if vision_helper is not None else None
    fixed_loss, grad_norm, _ = _fixed_batch_check(model, shared.fixed_batch)
    if variant == "eager":
        shared.eager_fixed_loss = fixed_loss
        shared.eager_fixed_grad_norm = grad_norm
    out: dict[str, Any] = {"grad_norm": grad_norm, "loss_mean": float(fixed_loss.mean())}
    if vision_helper is not None:
        out["vision_replayed"] = vision_helper.stats.replays - replays_before
    if variant != "eager" and shared.eager_fixed_loss is not None:
        from bridge_cudagraph.testing.parity import diff_losses

        d = diff_losses(fixed_loss, shared.eager_fixed_loss)
        out.update(
            loss_max_abs_diff=d.loss_max_abs,
            loss_rel_l2=d.loss_rel_l2,
            loss_exact=d.loss_exact,
            grad_norm_rel_diff=abs(grad_norm - shared.eager_fixed_grad_norm)
            / max(abs(shared.eager_fixed_grad_norm), 1e-12),
        )
    return out


def _record_counters(rec: dict, variant: str, helpers: list) -> None:
    """Ours' replay and fallback counters (upstream's helpers keep none)."""
    if not is_ours(variant) and not any(hasattr(h, "stats") for h in helpers):
        return
    rec["counters"] = {
        h.submodule: {
            "replays": h.stats.replays,
            "eager_fallbacks": h.stats.eager_fallbacks,
            "graphs": h.stats.graphs,
            "failed": h.stats.failed,
        }
        for h in helpers
    }
    rec["eager_fallbacks"] = sum(h.stats.eager_fallbacks for h in helpers)
    rec["vision_replays"] = sum(h.stats.replays for h in helpers if h.submodule == "vision")


#: The paired phase holds both graphed models at once; it runs only when their first runs' peaks (less what was
#: allocated before either, counted once) fit in this share of the GPU's memory.
PAIRED_MEMORY_FRACTION = 0.9
#: The two variants of the paired phase by default (ratios are the first's step time over the second's);
#: ``--paired-with`` picks the second.
PAIRED = ("upstream", "ours")


def paired_names(paired_with: str = PAIRED[1]) -> tuple[str, str]:
    """The paired phase's two variants: upstream and ``paired_with`` (one of ours)."""
    if not is_ours(paired_with):
        raise ValueError(f"--paired-with {paired_with!r}: pair upstream with one of {list(OURS_VARIANTS)}")
    return (PAIRED[0], paired_with)


def parse_lever_pairs(text: str | Sequence[str] | None) -> list[tuple[str, str]]:
    """``--lever-pairs`` (``A:B,C:D``): pairs of ours' variants whose steps a paired phase interleaves, each
    ratio ``A``'s step over ``B``'s (above 1: ``B`` faster). Separate runs of two levers a few percent apart cannot
    tell them apart (the eager step moved 25% between two device calls of this benchmark); pairs can."""
    if not text:
        return []
    items = [t.strip() for t in text.split(",")] if isinstance(text, str) else list(text)
    pairs = []
    for item in (i for i in items if i):
        a, sep, b = item.partition(":")
        if not sep or not (is_ours(a) and is_ours(b)) or a == b:
            raise ValueError(f"--lever-pairs {item!r}: write A:B with two different variants of {list(OURS_VARIANTS)}")
        pairs.append((a, b))
    return pairs


def paired_memory_check(results: dict[str, dict], total_bytes: int, names: Sequence[str] = PAIRED) -> str | None:
    """Why the paired phase cannot hold both models ``names`` at once, or None when it can (from their first runs'
    ``peak_memory_bytes``: a conservative sum, since the eager warmup peak of one never overlaps the other's)."""
    recs = [results.get(name) or {} for name in names]
    if any(r.get("status") != "ok" or not r.get("peak_memory_bytes") for r in recs):
        return f"a first run of {' or '.join(names)} did not finish"
    start = min(int(r.get("allocated_at_start_bytes") or 0) for r in recs)
    need = sum(int(r["peak_memory_bytes"]) for r in recs) - start
    if need > PAIRED_MEMORY_FRACTION * total_bytes:
        return (
            f"both models at once need up to {need / 2**30:.1f} GiB (the sum of their peaks), over "
            f"{PAIRED_MEMORY_FRACTION:.0%} of the GPU's {total_bytes / 2**30:.1f} GiB"
        )
    return None


def _run_paired(shared: _Shared, names: tuple[str, str] | None = None) -> dict:
    """Upstream and ours built side by side, each warmed up and captured, then their measured steps interleaved:
    step ``i`` on one, at once step ``i`` on the other, the first of each pair alternating. Host conditions that
    drift over seconds (the step times wander by 10-20% on a host-bound step) then weigh on both halves of a pair
    alike, and the per-pair ratios give a distribution-free confidence interval
    (:func:`benchmarks.bench_report.paired_verdict`). ``names``: another pair (two of ours' levers). Always
    frees both."""
    from bridge_cudagraph.testing.world import seed_rng

    names = names or paired_names(shared.paired_with)
    rec: dict[str, Any] = {"status": "running", "variants": list(names)}
    objs: dict[str, dict] = {name: {} for name in names}
    started = time.perf_counter()
    _free()
    rec["allocated_at_start_bytes"] = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    runners: dict[str, Callable[[int], float]] = {}
    try:
        for name in names:
            seed_rng(shared.world.language, SEED)
            _build_variant(shared, name, objs[name])
            objs[name]["helpers"] = _make_helpers(shared, name, objs[name])
            runners[name] = _step_runner(shared, objs[name])
            for i in range(shared.warmup_steps):
                runners[name](i)
            rec.setdefault("capture_s", {})[name] = _capture(name, objs[name]["helpers"])["capture_s"]
        times: dict[str, list[float]] = {name: [] for name in names}
        first = shared.warmup_steps
        for k, i in enumerate(range(first, first + shared.measured_steps)):
            for name in names if k % 2 == 0 else names[::-1]:
                times[name].append(runners[name](i))
        rec["step_ms"] = times
        rec["step_ms_median"] = {name: _median(t) for name, t in times.items()}
        rec["ratios"] = [a / b for a, b in zip(*(times[name] for name in names), strict=True)]
        rec["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
        rec["status"] = "ok"
    except Exception as error:  # recorded; the variants' own results stand
        _record_failure(rec, error, f"{shared.cfg.name} paired")
    finally:
        runners.clear()  # their closures hold the models: without this both outlive the teardown
        survivors = {name: _teardown(objs[name]) for name in names}
        # Survivors first: releasing them leaves a clean count for a variant that left none.
        for name in sorted(names, key=lambda n: not survivors[n]):
            part: dict[str, Any] = {"allocated_at_start_bytes": rec["allocated_at_start_bytes"]}
            _check_freed(part, survivors[name])
            if "leak" in part:
                rec.setdefault("leak", {})[name] = part["leak"]
        rec["left_allocated_bytes"] = torch.cuda.memory_allocated()
    rec["seconds"] = time.perf_counter() - started
    return rec


def _throughput(shared: _Shared, steps: Iterable[int], times: Sequence[float]) -> dict[str, Any]:
    """Model FLOPs per step, achieved TFLOP/s and MFU (:mod:`benchmarks.flops`) over the timed ``steps``."""
    from benchmarks.flops import peak_tflops

    flops = [shared.flops_per_step[i] for i in steps] if shared.flops_per_step else []
    if not flops or not times:
        return {}
    tflops = sum(flops) / (sum(times) * 1e-3) / 1e12
    peak = peak_tflops(torch.cuda.get_device_name())
    return {
        "model_flops_per_step": statistics.fmean(flops),
        "model_tflops_per_s": tflops,
        "peak_tflops": peak,
        "mfu": tflops / peak if peak else None,
    }


def _flops_per_step(cfg: BenchConfig, shared: _Shared) -> list[float]:
    """Model FLOPs of every step of ``shared.plan`` (:func:`benchmarks.flops.step_flops` on its micro-batches)."""
    from benchmarks.flops import step_flops

    if not all("input_ids" in b for b in shared.batches):
        return []  # not model inputs (the CPU tests' stand-ins): no MFU
    provider = make_provider(cfg, None)
    per_batch = [step_flops(provider, [b]) for b in shared.batches]
    return [sum(per_batch[k] for k in step) for step in shared.plan]


def _gpu_memory_bytes() -> int:
    """The current GPU's memory, or the cap ``--gpu-memory`` set on this process (:func:`cap_gpu_memory`)."""
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return min(total, GPU_MEMORY_CAP[0]) if GPU_MEMORY_CAP else total


#: The cap :func:`cap_gpu_memory` set (bytes), empty without one.
GPU_MEMORY_CAP: list[int] = []


def cap_gpu_memory(gib: float | None) -> float | None:
    """``--gpu-memory GIB``: cap this process's CUDA allocations at GIB (torch's per-process memory fraction, as
    ``bridge-cudagraph train --gpu-memory`` does: an 80 GB H100 on a larger GPU); returns the fraction set."""
    if gib is None:
        return None
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    fraction = min(1.0, gib * 2**30 / total)
    torch.cuda.set_per_process_memory_fraction(fraction)
    GPU_MEMORY_CAP[:] = [int(fraction * total)]
    return fraction


def _step_runner(
    shared: _Shared, objs: dict, *, losses: list | None = None, grad_norms: list | None = None
) -> Callable[[int], float]:
    """``run(i)``: training step ``i`` of the plan on ``objs``' model (its schedule through ``objs``' full-iteration
    wrapper where it has one); its wall ms. Each step's loss and grad norm are appended to
    ``losses`` and ``grad_norms`` when given."""
    model, optimizer = objs["model"], objs["optimizer"]
    schedule = objs.get("full_iteration")

    def run(i: int) -> float:
        micro_batches = [shared.batches[k] for k in shared.plan[i]]
        norms = [] if grad_norms is None else grad_norms
        loss, ms = _train_step(model, optimizer, micro_batches, shared.world.language, norms, schedule)
        if losses is not None:
            losses.append(loss)
        return ms

    return run


def _import_providers(configs: Sequence[BenchConfig], variants: Sequence[str]) -> None:
    """Make every variant's provider once, before any model exists, and drop it.

    A provider's first construction imports lazily, and some import on that path keeps its traceback alive; the frames
    it pins can reach up to ``_run_variant_body`` of the first variant and keep that variant's model and optimizer for
    the rest of the process (results/padded-vs-upstream/README.md, "Leaks the benchmark found"). Made here, the pinned
    frames end at :func:`run`, which holds no model."""
    for cfg in configs:
        for variant in variants:
            with contextlib.suppress(Exception):  # a variant that cannot be made fails, recorded, when it runs
                variant_provider(cfg, variant)


def _break_ddp_cycles(model: Any) -> None:
    """Drop Megatron DDP's ``grad_accs`` (the AccumulateGrad nodes whose hooks close over the DDP module): that
    cycle runs through C++ autograd nodes that Python's collector cannot see, so without this every deleted DDP
    model stays alive (results/padded-vs-upstream/README.md, "Leaks the benchmark found")."""
    for chunk in model or []:
        grad_accs = getattr(chunk, "grad_accs", None)
        if isinstance(grad_accs, list):
            grad_accs.clear()


def _teardown(objs: dict) -> dict:
    """Delete graphs, hooks, the micro-batch calculator, model and optimizer, and give the memory back. Returns
    what of the model (``"model"``: its chunks) and the optimizer (``"optimizer"``) is still alive after that, for
    :func:`_check_freed`."""
    chunk_refs = [weakref.ref(chunk) for chunk in objs.get("model") or []]
    optimizer_ref = weakref.ref(objs["optimizer"]) if objs.get("optimizer") is not None else None
    timer = objs.get("timer")
    if timer is not None:
        timer.remove()
    for helper in objs.get("helpers") or []:
        try:
            if helper.graphs_created():
                helper.delete_cuda_graphs()
        except Exception as error:
            logger.warning("bench: deleting %s graphs failed: %s", type(helper).__name__, error)
    if objs.get("full_iteration") is not None:
        objs["full_iteration"].close()  # megatron-core keeps its graph and static buffers on the class
    if objs.get("calculator"):
        from megatron.core.num_microbatches_calculator import destroy_num_microbatches_calculator

        destroy_num_microbatches_calculator()
    if objs.get("exits") is not None:
        objs["exits"].close()  # the optimizer graph, its class-level state cleared
    _break_ddp_cycles(objs.get("model"))
    objs.clear()
    _free()
    survivors: dict[str, Any] = {}
    chunks = [chunk for chunk in (ref() for ref in chunk_refs) if chunk is not None]
    if chunks:
        survivors["model"] = chunks
    optimizer = optimizer_ref() if optimizer_ref is not None else None
    if optimizer is not None:
        survivors["optimizer"] = optimizer
    return survivors


# ============================================================================================ configurations
def run_config(
    cfg: BenchConfig,
    world,
    *,
    measured_steps: int,
    warmup_steps: int,
    profile: bool,
    profiler_sees_graph_kernels: bool | None,
    variants: Sequence[str] = DEFAULT_VARIANTS,
    rounds: int = DEFAULT_ROUNDS,
    paired: bool = True,
    paired_with: str = PAIRED[1],
    lever_pairs: Sequence[tuple[str, str]] = (),
    on_progress: Callable[[dict], None] | None = None,
    trace_dir: str | None = None,
) -> dict:
    """All variants of one configuration (in :func:`run_plan`); the result dict of ``bench.json``'s ``configs``
    list, with ``status="complete"``. A graphed variant's later rounds go into its record's ``repeat_rounds``
    (each with its ``position`` in the run order, as the first round's ``position``). ``on_progress`` receives the
    same dict with ``status="running"`` and the variants finished so far after each run, so a process killed
    mid-configuration keeps them. ``paired``: then the paired phase (:func:`_run_paired`), into ``out["paired"]``,
    when both graphed variants ran and fit in memory together (:func:`paired_memory_check`; else its reason)."""
    started = time.perf_counter()
    out = cfg.as_dict()
    say(
        f"{cfg.name}: patches per micro-batch {out['patches_per_microbatch']}, vision budgets "
        f"{out['vision_budgets']}, upstream vision length {out['upstream_vision_seq_length']}"
    )
    batches = [make_batch(cfg, images, seed=1000 + i) for i, images in enumerate(cfg.image_sets)]
    fixed_index = max(range(len(cfg.image_sets)), key=lambda i: out["patches_per_microbatch"][i])
    fixed_batch = make_batch(cfg, cfg.image_sets[fixed_index], seed=4242)
    out["fixed_batch_images"] = out["images"][fixed_index]
    profile_steps = cycle_length(cfg) if profile else 0
    total = warmup_steps + measured_steps + profile_steps
    shared = _Shared(
        cfg=cfg,
        world=world,
        batches=batches,
        fixed_batch=fixed_batch,
        plan=step_plan(cfg, total),
        warmup_steps=warmup_steps,
        measured_steps=measured_steps,
        profile_steps=profile_steps,
        profiler_sees_graph_kernels=profiler_sees_graph_kernels,
        paired_with=paired_with,
        lever_pairs=list(lever_pairs),
        trace_dir=trace_dir,
    )
    shared.flops_per_step = _flops_per_step(cfg, shared)
    out["profile_steps"] = profile_steps
    results: dict[str, dict] = {}
    plan = run_plan(variants, rounds)
    for position, (variant, round_) in enumerate(plan):
        say(f"{cfg.name} {variant}: start" + (f" (timing round {round_})" if round_ > 1 else ""))
        if round_ > 1 and (results.get(variant) or {}).get("status") != "ok":
            continue  # its first round failed: nothing to time again
        rec = _run_variant(shared, variant, timing_only=round_ > 1)
        rec["position"] = position
        if round_ > 1:
            rec["round"] = round_
            results[variant].setdefault("repeat_rounds", []).append(rec)
            say(f"{cfg.name} {variant} round {round_}: step {rec.get('step_ms_median') or float('nan'):.2f} ms")
        else:
            results[variant] = rec
            say(_summary_line(cfg.name, variant, rec))
        if variant == "eager" and rec["status"] != "ok":
            say(f"{cfg.name}: eager failed; the other variants have no reference and are skipped")
            break
        if variant == "eager":
            shared.eager = rec
        _finish_variants(results)
        if on_progress is not None:
            on_progress({**out, "status": "running", "variants": dict(results)})
    _finish_variants(results)
    out["variants"] = results
    names = paired_names(paired_with)
    if paired and all(name in results for name in names):
        why_not = paired_memory_check(results, _gpu_memory_bytes(), names)
        if why_not is None:
            say(f"{cfg.name}: paired phase ({' and '.join(names)} side by side, steps interleaved)")
            out["paired"] = _run_paired(shared)
            out["paired"]["position"] = len(plan)
            say(f"{cfg.name} paired: {bench_report.fmt_paired(out['paired'])}")
        else:
            out["paired"] = {"status": "skipped", "reason": why_not}
            say(f"{cfg.name}: paired phase skipped: {why_not}")
    for pair in shared.lever_pairs if paired else []:
        if not all(name in results for name in pair):
            continue
        why_not = paired_memory_check(results, _gpu_memory_bytes(), pair)
        rec = (
            {"status": "skipped", "variants": list(pair), "reason": why_not} if why_not else _run_paired(shared, pair)
        )
        out.setdefault("lever_pairs", []).append(rec)
        say(f"{cfg.name} paired {pair[0]} vs {pair[1]}: {bench_report.fmt_paired(rec, second=pair[1])}")
    out["status"] = FINISHED
    out["seconds"] = time.perf_counter() - started
    del shared, batches, fixed_batch
    _free()
    return out


def run_order(variants: Iterable[str], known: Sequence[str] = VARIANTS) -> list[str]:
    """The order the variants of one configuration run in: eager first (always: the reference of every other), the
    graphed ones as given, the control, then upstream's full-iteration graph. The control runs after the graphed
    ones because it then runs in the process state they ran in (allocator, clocks), so its step time also shows
    whether that state moved eager's timing. The full-iteration graph runs after everything: when its capture fails
    (Qwen3-VL's encoder reads the device from the host inside it), torch leaves the CUDA generators registered with
    the abandoned graph, and every later forward with dropout or RNG fails ("Offset increment outside graph capture
    encountered unexpectedly": the control after it, run 65)."""
    chosen = list(dict.fromkeys(variants))
    unknown = [v for v in chosen if v not in known]
    if unknown:
        raise ValueError(f"unknown variants {unknown}; known: {tuple(known)}")
    middle = [v for v in chosen if v not in UNGRAPHED and v != FULL_ITERATION]
    return [
        "eager",
        *middle,
        *([CONTROL] if CONTROL in chosen else []),
        *([FULL_ITERATION] if FULL_ITERATION in chosen else []),
    ]


def run_plan(variants: Iterable[str], rounds: int = DEFAULT_ROUNDS) -> list[tuple[str, int]]:
    """``(variant, round)`` in the order one configuration runs them: :func:`run_order` as round 1, then each later
    round's graphed variants, reversed in even rounds. With two rounds upstream and ours run A B (control) B A: a
    drift of the process or host over the configuration weighs on both alike, and each variant's two rounds show
    how far one variant's own median moves between builds."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    first = run_order(variants)
    last = [v for v in first if v == FULL_ITERATION]  # one round, after every other (see run_order)
    first = [v for v in first if v != FULL_ITERATION]
    graphed = [v for v in first if v not in UNGRAPHED]
    plan = [(v, 1) for v in first]
    for round_ in range(2, rounds + 1):
        plan += [(v, round_) for v in (reversed(graphed) if round_ % 2 == 0 else graphed)]
    return plan + [(v, 1) for v in last]


def _finish_variants(results: dict[str, dict]) -> None:
    """Speedups vs eager, and each graphed variant's loss drift against the noise floor (the control)."""
    eager_ms = (results.get("eager") or {}).get("step_ms_median")
    for rec in results.values():
        if rec.get("status") == "ok" and eager_ms and rec.get("step_ms_median"):
            rec["speedup_vs_eager"] = eager_ms / rec["step_ms_median"]
    control = results.get(CONTROL)
    for name, rec in results.items():
        if name not in UNGRAPHED and rec.get("status") == "ok" and control is not None:
            rec["vs_noise_floor"] = bench_report.noise_floor_verdict(rec, control)


def _summary_line(config: str, variant: str, rec: dict) -> str:
    if rec.get("status") != "ok":
        return f"{config} {variant}: {rec.get('status')}"

    def f(key, spec):
        v = rec.get(key)
        return "n/a" if v is None else format(v, spec)

    fixed = rec.get("fixed_batch") or {}
    diff = fixed.get("loss_max_abs_diff")
    return (
        f"{config} {variant}: step {f('step_ms_median', '.2f')} ms, busy {f('gpu_busy', '.2f')}, "
        f"capture {f('capture_s', '.1f')} s, peak {rec.get('peak_memory_bytes', 0) / 2**30:.1f} GiB, "
        f"loss diff {f('loss_max_abs_diff_vs_eager', '.2e')}, per-token diff "
        f"{'n/a' if diff is None else format(diff, '.2e')}, vision {f('vision_ms', '.2f')} ms/mb, "
        f"{rec.get('seconds', 0):.0f} s"
    )


def _meta(*, measured_steps: int, warmup_steps: int, probe: dict | None, command: str | None) -> dict:
    from bridge_cudagraph.host.compat import installed_version

    return {
        "command": command or command_line(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformer_engine": installed_version("transformer-engine"),
        "megatron_core": installed_version("megatron-core"),
        "megatron_bridge": installed_version("megatron-bridge"),
        "python": platform.python_version(),
        "measured_steps": measured_steps,
        "warmup_steps": warmup_steps,
        "profile_steps": "one per distinct micro-batch of a configuration",
        "profiler_probe": probe,
        "profiler_sees_graph_kernels": None if probe is None else probe.get("sees_graph_kernels"),
        "world_size": torch.distributed.get_world_size() if torch.distributed.is_initialized() else None,
        "peak_tflops_table": dict(PEAK_BF16_TFLOPS),  # the dense BF16 peaks each variant's MFU is taken against
    }


def run(
    configs: Sequence[BenchConfig | str],
    *,
    out_dir: str | Path,
    measured_steps: int = DEFAULT_MEASURED_STEPS,
    warmup_steps: int = DEFAULT_WARMUP_STEPS,
    profile: bool = True,
    variants: Sequence[str] = DEFAULT_VARIANTS,
    rounds: int = DEFAULT_ROUNDS,
    paired: bool = True,
    paired_with: str = PAIRED[1],
    lever_pairs: Sequence[tuple[str, str]] = (),
    world=None,
    command: str | None = None,
    profile_stacks: bool = False,
) -> dict:
    """Run ``configs`` (objects or names) and write ``bench.json``, ``bench.md`` and ``bench.png`` into ``out_dir``
    (rewritten after every configuration, so a run cut short keeps what it finished). Returns the JSON's content.

    ``world``: a :class:`~bridge_cudagraph.testing.world.World` to run in (the GPU tests' session world); by
    default a one-GPU pure-M4 world is initialised here. ``profile_stacks``: ``--profile-stacks``.
    """
    if measured_steps < 1 or warmup_steps < 0:
        raise ValueError("measured_steps must be >= 1 and warmup_steps >= 0")
    run_plan(variants, rounds)  # raises on an unknown variant or a bad round count before the GPU is touched
    paired_names(paired_with)
    if not torch.cuda.is_available():
        raise RuntimeError("the benchmark needs a CUDA GPU")
    resolved = [c if isinstance(c, BenchConfig) else configs_by_name([c])[0] for c in configs]
    if world is None:
        from bridge_cudagraph.parallel.layout import VisionLayout
        from bridge_cudagraph.testing.world import init_world

        world = init_world(vision=VisionLayout(), seed=SEED)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    probe = None
    if profile:
        try:
            probe = probe_profiler_sees_graph_kernels()
        except Exception as error:
            probe = {"error": f"{type(error).__name__}: {error}"[:500], "sees_graph_kernels": None}
        say(f"profiler probe: {probe}")
    meta = _meta(measured_steps=measured_steps, warmup_steps=warmup_steps, probe=probe, command=command)
    meta["variants"] = run_order(variants)
    meta["rounds"] = rounds
    meta["paired"] = paired
    meta["paired_with"] = paired_with
    meta["lever_pairs"] = [list(p) for p in lever_pairs]
    meta["noise_floor_control"] = CONTROL in meta["variants"]
    meta["noise_factor"] = bench_report.NOISE_FACTOR
    meta["profile_stacks"] = profile_stacks
    data = {"meta": meta, "configs": []}
    json_path = out / "bench.json"

    def write(partial: dict | None = None) -> None:
        # Rewritten after every variant (with the configuration in progress marked "running"), so a process that is
        # killed keeps every variant it finished.
        write_json(json_path, {**data, "configs": [*data["configs"], *([partial] if partial else [])]})

    write()
    _import_providers(resolved, variants)
    for cfg in resolved:
        data["configs"].append(
            run_config(
                cfg,
                world,
                measured_steps=measured_steps,
                warmup_steps=warmup_steps,
                profile=profile,
                profiler_sees_graph_kernels=None if probe is None else probe.get("sees_graph_kernels"),
                variants=variants,
                rounds=rounds,
                paired=paired,
                paired_with=paired_with,
                lever_pairs=lever_pairs,
                on_progress=write,
                trace_dir=str(out) if profile_stacks else None,
            )
        )
        write()
        try:
            render(json_path)
        except Exception as error:  # the JSON is the result; the report can be rendered again on any machine
            say(f"render failed ({type(error).__name__}: {error}); run bench_report render {json_path}")
    _print_table(data)
    return json_safe(data)


def _print_table(data: dict) -> None:
    print("\nconfig | variant | step ms | speedup | GPU busy | capture s | peak GiB | loss diff | per-token diff")
    for config in data["configs"]:
        for name, rec in config["variants"].items():
            if rec.get("status") != "ok":
                print(f"{config['name']} | {name} | {rec.get('status')}: {str(rec.get('error'))[:80]}")
                continue
            fixed = rec.get("fixed_batch") or {}

            def g(v, spec):
                return "-" if v is None else format(v, spec)

            print(
                f"{config['name']} | {name} | {g(rec.get('step_ms_median'), '.2f')} | "
                f"{g(rec.get('speedup_vs_eager'), '.2f')} | {g(rec.get('gpu_busy'), '.2f')} | "
                f"{g(rec.get('capture_s'), '.1f')} | {rec.get('peak_memory_bytes', 0) / 2**30:.1f} | "
                f"{g(rec.get('loss_max_abs_diff_vs_eager'), '.1e')} | {g(fixed.get('loss_max_abs_diff'), '.1e')}"
            )
    sys.stdout.flush()


# ============================================================================================ command line
def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The benchmark's options (for ``bridge-cudagraph bench`` and ``python -m benchmarks.bench``)."""
    parser.add_argument("--out", default="results/bench", help="output folder for bench.json/.md/.png")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny + small at micro-batch 1, sequence 2048 only (~5 min on an H200 with the control)",
    )
    parser.add_argument(
        "--configs",
        default=None,
        help="comma-separated configuration names (tiny, small-mbs{1,2}-seq{2048,4096}); overrides --quick",
    )
    parser.add_argument("--measured-steps", type=int, default=DEFAULT_MEASURED_STEPS)
    parser.add_argument("--warmup-steps", type=int, default=DEFAULT_WARMUP_STEPS)
    parser.add_argument("--no-profile", action="store_true", help="skip torch.profiler (no GPU-busy fraction)")
    parser.add_argument(
        "--profile-stacks",
        action="store_true",
        help="profile with Python stacks: the host-time report names the Python functions the GPU waited on, and "
        "each variant's trace is kept in --out (trace_<config>_<variant>.json.gz; the stacks add host overhead, so "
        "that run's GPU busy is a lower bound)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=DEFAULT_ROUNDS,
        help="timed rounds per graphed variant (later ones timing-only, in alternating order after the control): "
        "how far one variant's median moves between builds",
    )
    parser.add_argument(
        "--no-paired",
        action="store_true",
        help="skip the paired phase (upstream and ours side by side, steps interleaved) that the ours-vs-upstream "
        "verdict rests on",
    )
    parser.add_argument(
        "--paired-with",
        default=PAIRED[1],
        help=f"which of ours the paired phase sets against upstream: one of {', '.join(OURS_VARIANTS)}",
    )
    parser.add_argument(
        "--lever-pairs",
        default="",
        help="after the paired phase, more of them between two of ours' variants: A:B[,C:D] (ratio A's step over "
        "B's); both must be among --variants",
    )
    parser.add_argument(
        "--variants",
        default=",".join(MAIN_VARIANTS),
        help=f"comma-separated, of {','.join(v for v in VARIANTS if v != CONTROL)} (eager always runs; the "
        "eager_repeat control too, unless --no-control)",
    )
    parser.add_argument(
        "--no-control",
        action="store_true",
        help="skip eager_repeat, the second eager run that measures the run-to-run noise floor",
    )
    parser.add_argument(
        "--gpus",
        type=int,
        default=None,
        help="split the configurations over N GPUs: one child process per GPU (CUDA_VISIBLE_DEVICES), each running "
        "all variants of its configurations; their results are merged into --out",
    )
    parser.add_argument(
        "--devices", default=None, help="like --gpus, on these CUDA_VISIBLE_DEVICES ids (comma-separated)"
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="with --gpus/--devices: stop a child after SECONDS; what it finished is kept, the rest marked failed",
    )
    return parser


def select_configs(*, quick: bool = False, names: str | Sequence[str] | None = None) -> list[BenchConfig]:
    """``names`` (comma-separated or a list) if given, else :func:`quick_configs` or :func:`full_configs`."""
    if names:
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",") if n.strip()]
        return configs_by_name(names)
    return quick_configs() if quick else full_configs()


def select_variants(variants: str | Sequence[str] | None, *, control: bool = True) -> list[str]:
    """``--variants`` as a list, with the control added (``control``) or removed (``--no-control``)."""
    if variants is None:
        variants = MAIN_VARIANTS
    if isinstance(variants, str):
        variants = [v.strip() for v in variants.split(",") if v.strip()]
    chosen = [v for v in variants if v != CONTROL]
    return [*chosen, CONTROL] if control else chosen


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__.split("\n")[0])
    return add_arguments(parser).parse_args(argv)


def _failed_variants(data: dict) -> list[str]:
    """``config/variant`` of every variant that did not finish (a refused one is an outcome, not a failure)."""
    return [
        f"{c['name']}/{name}"
        for c in data["configs"]
        for name, rec in (c.get("variants") or {}).items()
        if rec.get("status") not in ("ok", REFUSED)
    ]


def main(args: Sequence[str] | argparse.Namespace | None = None) -> int:
    """Entry point of ``python -m benchmarks.bench``: ``args`` is a list of command-line strings, None
    (``sys.argv``), or an ``argparse.Namespace`` whose attributes of :func:`add_arguments` win over the defaults.

    Exit code 1 when eager or ours failed anywhere, or (``--gpus``) a child did not finish its configurations."""
    if args is None or isinstance(args, list | tuple):
        args = _parse(args)
    else:
        base = _parse([])
        for key in vars(base):
            if getattr(args, key, None) is not None:
                setattr(base, key, getattr(args, key))
        args = base
    variants = select_variants(getattr(args, "variants", None), control=not getattr(args, "no_control", False))
    run_plan(variants, int(getattr(args, "rounds", None) or DEFAULT_ROUNDS))
    configs = select_configs(quick=bool(getattr(args, "quick", False)), names=getattr(args, "configs", None))
    out_dir = getattr(args, "out", None) or "results/bench"
    gpus, devices = getattr(args, "gpus", None), getattr(args, "devices", None)
    time_limit = getattr(args, "time_limit", None)
    if gpus is not None or devices:
        chosen = bench_gpus.resolve_devices(gpus, devices, os.environ.get("CUDA_VISIBLE_DEVICES"))
        data, _ = bench_gpus.run_on_gpus(
            configs,
            chosen,
            out_dir=out_dir,
            make_argv=lambda names, child_out: bench_gpus.child_argv(args, names, child_out),
            time_limit_s=time_limit,
        )
        _print_table(data)
        unfinished = [c["name"] for c in data["configs"] if c.get("status") not in (None, FINISHED)]
        if unfinished:
            say(f"unfinished configurations: {unfinished}")
        failed = [f for f in _failed_variants(data) if f.endswith(("/ours", "/eager"))]
        return 1 if failed or unfinished else 0
    if time_limit is not None:
        raise SystemExit("--time-limit applies to the children of --gpus/--devices (use --gpus 1 for one GPU)")
    import torch.distributed as dist

    owns_world = not dist.is_initialized()
    try:
        data = run(
            configs,
            out_dir=out_dir,
            measured_steps=int(getattr(args, "measured_steps", None) or DEFAULT_MEASURED_STEPS),
            warmup_steps=int(getattr(args, "warmup_steps", DEFAULT_WARMUP_STEPS)),
            profile=not bool(getattr(args, "no_profile", False)),
            variants=variants,
            rounds=int(getattr(args, "rounds", None) or DEFAULT_ROUNDS),
            paired=not bool(getattr(args, "no_paired", False)),
            paired_with=str(getattr(args, "paired_with", None) or PAIRED[1]),
            lever_pairs=parse_lever_pairs(getattr(args, "lever_pairs", None)),
            profile_stacks=bool(getattr(args, "profile_stacks", False)),
        )
    finally:
        if owns_world and dist.is_initialized():
            dist.destroy_process_group()
    failed = _failed_variants(data)
    if failed:
        say(f"failed variants: {failed}")
    return 1 if [f for f in failed if f.endswith(("/ours", "/eager"))] else 0


if __name__ == "__main__":
    logging.basicConfig(level=os.environ.get("BRIDGE_CUDAGRAPH_LOG", "WARNING"))
    raise SystemExit(main())
