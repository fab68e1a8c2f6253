"""Graphed vs graphs-off comparisons: per-token loss, every parameter gradient, and optimizer steps.

The reference and the graphed model hold identical weights and see identical batches; the numbers these
functions return are what the GPU tests assert and what ``results/`` records.

Every comparison here fails on a NaN or an infinity: Python's ``max()`` skips NaN (``max(0.0, nan) == 0.0``), which
once let a pipeline-parallel run with NaN losses in 26 of 30 steps be recorded as "identical"
(``results/multi-gpu/two_gpus_run7a.json``, case ``pp2_4mb``). So the numbers are computed with torch, whose reductions
propagate NaN, and a non-finite value on either side is a failure of its own, named as such.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass

import torch

from bridge_cudagraph.micro_batch import open_micro_batch
from bridge_cudagraph.testing.bounds import GRAD_BOUND, LOSS_BOUND
from bridge_cudagraph.testing.step_batch import CPU_GRIDS

#: Where kernels are not bitwise deterministic (vision attention backward on packed sequences), a graphed run is
#: held to this multiple of the eager-vs-eager floor measured in the same test: the graphed-vs-eager difference is
#: one more draw of the same noise, and a max over draws is not bounded by one other draw's max.
FLOOR_FACTOR = 2.0


def _as_float64(values: Sequence[float | None]) -> torch.Tensor:
    """``values`` as a float64 tensor, ``None`` (a step that produced no number) as NaN."""
    return torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float64)


@dataclass(frozen=True)
class SeriesDiff:
    """Two per-step series (losses, grad norms) compared step by step, NaN and inf included.

    ``max_abs`` is NaN when any step of either side is not finite, and such a series is never ``identical`` nor
    ``within`` any bound: a run that diverged is not a run that matched.
    """

    name: str
    steps: int
    max_abs: float
    max_rel: float
    exact_steps: int
    nonfinite_steps: tuple[int, ...]
    """Indices of the steps where either side is NaN, inf or missing."""

    @property
    def finite(self) -> bool:
        """Whether both series are finite at every step."""
        return not self.nonfinite_steps

    @property
    def identical(self) -> bool:
        """Bit-identical at every step (and finite)."""
        return self.finite and self.exact_steps == self.steps

    def within(self, bound: float) -> bool:
        """Finite at every step and no step more than ``bound`` apart (absolute)."""
        return self.finite and self.max_abs <= bound

    def describe(self) -> str:
        """One line for an assertion message."""
        bad = f", NOT FINITE at steps {list(self.nonfinite_steps)}" if self.nonfinite_steps else ""
        return (
            f"{self.name}: {self.exact_steps} of {self.steps} steps identical, max abs diff {self.max_abs:.3e}, "
            f"max rel diff {self.max_rel:.3e}{bad}"
        )

    def require_identical(self) -> None:
        """Raise ``AssertionError`` unless every step is finite and bit-identical."""
        if not self.identical:
            raise AssertionError(self.describe())

    def require_within(self, bound: float) -> None:
        """Raise ``AssertionError`` unless every step is finite and within ``bound``."""
        if not self.within(bound):
            raise AssertionError(f"{self.describe()} (bound {bound:.3e})")

    def as_dict(self) -> dict:
        """For JSON (``identical`` and ``finite`` included; NaN stays NaN)."""
        return {**asdict(self), "nonfinite_steps": list(self.nonfinite_steps), "identical": self.identical}


def compare_series(a: Sequence[float | None], b: Sequence[float | None], *, name: str = "loss") -> SeriesDiff:
    """Compare series ``a`` (the run under test) with ``b`` (the reference), step by step.

    Raises ``ValueError`` when the lengths differ (a step went missing: no comparison can mean anything then), or
    when both are empty (a run that logged nothing compares equal to anything: an 8B call once, whose two
    runs had refused to start, read as "identical"). ``max_rel`` is relative to ``|b|`` (floored at 1e-12).
    """
    if len(a) != len(b):
        raise ValueError(f"{name}: {len(a)} steps against {len(b)} in the reference")
    if not a:
        raise ValueError(f"{name}: no steps to compare (did the runs train at all?)")
    ta, tb = _as_float64(a), _as_float64(b)
    bad = ~(torch.isfinite(ta) & torch.isfinite(tb))
    d = (ta - tb).abs()
    rel = d / tb.abs().clamp(min=1e-12)
    return SeriesDiff(
        name=name,
        steps=len(a),
        # torch's max propagates NaN; a non-finite step makes the whole difference NaN, never 0.
        max_abs=math.nan if bad.any() else float(d.max()),
        max_rel=math.nan if bad.any() else float(rel.max()),
        exact_steps=int((ta == tb).sum()),
        nonfinite_steps=tuple(int(i) for i in bad.nonzero().flatten()),
    )


def noise_floor(runs: Sequence[Sequence[float | None]], *, name: str = "loss") -> float:
    """The eager-vs-eager floor: the largest max abs difference between any two of ``runs`` (the same eager model
    trained several times on the same data). Raises ``AssertionError`` if any run is not finite."""
    if len(runs) < 2:
        raise ValueError("a noise floor needs at least two runs")
    worst = 0.0
    for i in range(len(runs)):
        for j in range(i + 1, len(runs)):
            d = compare_series(runs[i], runs[j], name=f"{name} (eager run {i} vs {j})")
            if not d.finite:
                raise AssertionError(d.describe())
            worst = max(worst, d.max_abs)
    return worst


def _stat(stats, key: str):
    return stats.get(key) if isinstance(stats, Mapping) else getattr(stats, key, None)


def capture_problems(stats, *, where: str = "") -> list[str]:
    """What is wrong with an enabled submodule's capture: no graphs, no replay, or a failed capture.

    ``stats`` is a :class:`~bridge_cudagraph.capture.stats.CaptureStats` or its JSON form (a mapping with
    ``graphs``, ``replays`` and ``failed`` or ``failure``). A capture that fell back to eager trains correctly,
    so parity alone cannot see it: every test of an enabled submodule must ask this too.
    """
    label = where or str(_stat(stats, "submodule") or "capture")
    failed = _stat(stats, "failed") or _stat(stats, "failure")
    problems = []
    if failed is not None:
        problems.append(f"{label}: capture failed: {failed}")
    if not (_stat(stats, "graphs") or 0) > 0:
        problems.append(f"{label}: no graphs ({_stat(stats, 'graphs')})")
    if not (_stat(stats, "replays") or 0) > 0:
        problems.append(f"{label}: no replays ({_stat(stats, 'replays')})")
    return problems


def assert_captured(stats, *, where: str = "") -> None:
    """Raise ``AssertionError`` unless ``stats`` shows graphs > 0, replays > 0 and no failed capture."""
    problems = capture_problems(stats, where=where)
    if problems:
        raise AssertionError("; ".join(problems))


@dataclass
class Diff:
    """How far two runs are apart.

    A parameter with a gradient on one side only is a mismatch (``grad_missing``: never ``exact`` nor within any
    bound); one with no gradient on either side is reported (``grad_absent``) and compared no further. Both used to
    become zeros and compare "exact".
    """

    loss_max_abs: float
    loss_rel_l2: float
    loss_exact: bool
    grad_max_rel_l2: float = 0.0
    grad_exact_fraction: float = 1.0
    grad_worst: str = ""
    grad_missing: tuple[str, ...] = ()
    """Parameters with a gradient on one side only, as ``"name (graphed only)"`` or ``"name (reference only)"``."""
    grad_absent: tuple[str, ...] = ()
    """Parameters that require a gradient and got none on either side."""
    grad_worst_params: tuple[dict, ...] = ()
    """The parameters furthest apart, worst first (:func:`diff`'s ``worst``): ``name``, ``rel_l2`` (relative to the
    reference's norm), ``norm`` and ``reference_norm``; what says *which* gradients differ and whether one is
    missing (its norm 0) or only rounded."""

    @property
    def exact(self) -> bool:
        """Per-token loss and every gradient bit-identical, no gradient on one side only."""
        return self.loss_exact and self.grad_exact_fraction == 1.0 and not self.grad_missing

    def within_bound(self, loss_bound: float = LOSS_BOUND, grad_bound: float = GRAD_BOUND) -> bool:
        """DESIGN.md's parity bound (or the given ones); False on any NaN (NaN compares False) and on a gradient
        missing on one side."""
        return self.loss_max_abs <= loss_bound and self.grad_max_rel_l2 <= grad_bound and not self.grad_missing

    def require_exact(self, what: str = "") -> None:
        """Raise ``AssertionError`` unless the loss and every gradient are bit-identical (a gradient on one side only
        is named first)."""
        if not self.exact:
            missing = f"gradient on one side only: {list(self.grad_missing)}; " if self.grad_missing else ""
            raise AssertionError(f"{what}: not bit-identical: {missing}{self}")

    def as_dict(self) -> dict:
        """For JSON."""
        return asdict(self)


def model_kwargs(batch: dict) -> dict:
    """The model's keyword arguments for ``batch``: all its entries but two. ``loss_mask`` goes only where the batch is
    packed, as Bridge's Qwen3-VL step hands it to the model then (tight packing reads the rows' extents from it,
    :mod:`bridge_cudagraph.capture.tight`); the collate's CPU grids (:data:`~bridge_cudagraph.testing.step_batch.
    CPU_GRIDS`) never go: the forward step puts them in its micro-batch instead."""
    packed = batch.get("packed_seq_params") is not None
    return {k: v for k, v in batch.items() if (k != "loss_mask" or packed) and k != CPU_GRIDS}


def per_token_loss(model: list[torch.nn.Module], batch: dict) -> torch.Tensor:
    """The model's per-token loss ``[b, s]`` (fp32) for ``batch``, inside the micro-batch's context with its CPU
    grids (:func:`~bridge_cudagraph.micro_batch.open_micro_batch`), as Bridge's loop runs its step."""
    with open_micro_batch(batch.get(CPU_GRIDS)):
        out = model[0](**model_kwargs(batch))
    if isinstance(out, tuple):
        out = out[0]
    return out.float()


def masked_mean(loss: torch.Tensor, batch: dict) -> torch.Tensor:
    """Mean per-token loss over the tokens the loss mask keeps."""
    mask = batch.get("loss_mask")
    if mask is None:
        return loss.mean()
    return (loss * mask).sum() / mask.sum().clamp(min=1)


def loss_and_grads(
    model: list[torch.nn.Module], batch: dict, *, device: torch.device | str | None = None
) -> tuple[torch.Tensor, dict[str, torch.Tensor | None]]:
    """One forward/backward from zeroed gradient buffers; the per-token loss and every trainable parameter's
    gradient (``main_grad`` where DDP keeps one, else ``.grad``), ``None`` for a parameter that has neither: a
    missing gradient stays visible to :func:`diff` instead of becoming zeros. (A DDP buffer is zeroed, not absent,
    so under DDP a parameter the backward never reached reads as zeros: that case only a value check can see.)

    ``device``: where the fp32 copies go (None: beside the gradient). ``"cpu"`` keeps a 2B model's reference out of
    GPU memory while other models are built (:func:`diff` compares across devices)."""
    for chunk in model:
        chunk.zero_grad_buffer()  # type: ignore[operator]  # DDP's method, read through Module.__getattr__
    loss = per_token_loss(model, batch)
    masked_mean(loss, batch).backward()
    grads: dict[str, torch.Tensor | None] = {}
    for name, p in model[0].named_parameters():
        if not p.requires_grad:
            continue
        g = getattr(p, "main_grad", None)
        if g is None:
            g = p.grad
        if g is None:
            grads[name] = None
        elif device is None:
            grads[name] = g.detach().float().clone()
        else:
            grads[name] = g.detach().float().to(device, copy=True)
    return loss.detach(), grads


def grad_norm(grads: Mapping[str, torch.Tensor | None]) -> float:
    """The L2 norm of every gradient of ``grads`` together (accumulated in fp64; NaN propagates)."""
    total = sum(
        (float(torch.linalg.vector_norm(g, dtype=torch.float64)) ** 2 for g in grads.values() if g is not None), 0.0
    )
    return math.sqrt(total)


def grads_differ(a: Mapping[str, torch.Tensor | None], b: Mapping[str, torch.Tensor | None]) -> list[str]:
    """Names (of ``b``'s parameters) whose gradient differs bitwise, or exists on one side only."""
    out = []
    for name, gb in b.items():
        ga = a.get(name)
        if (ga is None) != (gb is None) or (ga is not None and gb is not None and not torch.equal(ga, gb)):
            out.append(name)
    return out


def nonfinite_grads(grads: Mapping[str, torch.Tensor | None]) -> list[str]:
    """Names whose gradient holds a NaN or an infinity (a missing gradient is not one: see :func:`diff`)."""
    return [name for name, g in grads.items() if g is not None and not bool(torch.isfinite(g).all())]


def diff_losses(a: torch.Tensor, b: torch.Tensor) -> Diff:
    """Loss part of a :class:`Diff`: NaN when either side holds a non-finite value (never "exact")."""
    if a.shape != b.shape:
        raise AssertionError(f"per-token loss shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return Diff(math.nan, math.nan, False)
    d = (a - b).abs()
    rel = float((a - b).norm() / b.norm().clamp(min=1e-12))
    return Diff(float(d.max()) if d.numel() else 0.0, rel, bool(torch.equal(a, b)))


def diff(
    a: tuple[torch.Tensor, dict],
    b: tuple[torch.Tensor, dict],
    *,
    worst: int = 0,
    loss_mask: torch.Tensor | None = None,
) -> Diff:
    """Compare ``loss_and_grads`` outputs of the graphed run ``a`` against the reference ``b``, every parameter's
    gradient by name (each pair on ``a``'s device where the two sides are on different ones).

    A gradient (``None`` in :func:`loss_and_grads`) missing on one side is listed in ``grad_missing`` and counts as
    not exact; missing on both it is listed in ``grad_absent`` and left out of ``grad_exact_fraction``. ``worst``:
    how many of the parameters furthest apart to list in ``grad_worst_params``. ``loss_mask``: compare the per-token
    loss on the tokens it keeps only (a tightly packed replay computes nothing on the padding rows it drops, which
    carry no loss: their per-token values are not the model's)."""
    loss_a, loss_b = a[0], b[0].to(a[0].device)
    if loss_mask is not None:
        keep = loss_mask.to(loss_a.device).reshape(loss_a.shape) > 0
        loss_a, loss_b = loss_a[keep], loss_b[keep]
    out = diff_losses(loss_a, loss_b)
    if set(a[1]) != set(b[1]):
        raise AssertionError(f"parameter names differ: {sorted(set(a[1]) ^ set(b[1]))[:5]}")
    exact, compared, worst_rel, worst_name = 0, 0, 0.0, ""
    missing, absent, apart = [], [], []
    for name, gb in b[1].items():
        ga = a[1][name]
        if ga is None or gb is None:
            if ga is None and gb is None:
                absent.append(name)
            else:
                missing.append(f"{name} ({'reference' if ga is None else 'graphed'} only)")
                compared += 1
            continue
        compared += 1
        gb = gb.to(ga.device)
        if not (torch.isfinite(ga).all() and torch.isfinite(gb).all()):
            if not math.isnan(worst_rel):  # the first one is named; the walk goes on for the missing gradients
                worst_rel, worst_name = math.nan, f"{name} (not finite)"
            continue
        if torch.equal(ga, gb):
            exact += 1
            continue
        ref_norm = float(gb.norm())
        rel = float((ga - gb).norm()) / max(ref_norm, 1e-12)
        if worst:
            apart.append({"name": name, "rel_l2": rel, "norm": float(ga.norm()), "reference_norm": ref_norm})
        if rel > worst_rel:
            worst_rel, worst_name = rel, name
    out.grad_max_rel_l2 = worst_rel
    out.grad_exact_fraction = exact / max(1, compared)
    out.grad_worst = worst_name
    out.grad_missing, out.grad_absent = tuple(missing), tuple(absent)
    out.grad_worst_params = tuple(sorted(apart, key=lambda p: -p["rel_l2"])[:worst])
    return out


def within_floor(graphed: Diff, floor: Diff) -> bool:
    """Whether ``graphed`` (graphed against eager) is within the eager-vs-eager ``floor`` measured on the same batch
    in the same run: the loss and every gradient bit-exact where the floor is exact (deterministic kernels), else
    no gradient missing, every value finite and the largest relative gradient difference at most
    :data:`FLOOR_FACTOR` times the floor's (and likewise the largest per-token loss difference)."""
    if floor.exact:
        return graphed.exact
    finite = math.isfinite(graphed.grad_max_rel_l2) and math.isfinite(graphed.loss_max_abs)
    return (
        finite
        and not graphed.grad_missing
        and graphed.grad_max_rel_l2 <= FLOOR_FACTOR * floor.grad_max_rel_l2
        and graphed.loss_max_abs <= FLOOR_FACTOR * floor.loss_max_abs
    )


def megatron_optimizer(
    model: list[torch.nn.Module],
    pg_collection,
    *,
    lr: float = 1e-4,
    optimizer_cuda_graph: bool = False,
    weight_decay: float = 0.0,
):
    """Bridge's default fine-tuning optimizer: distributed Adam in bf16 with fp32 main params, clip 1.0
    (``weight_decay`` applies to the group megatron-core decays: weights, not biases or norms).

    ``optimizer_cuda_graph`` is Bridge's ``optimizer.optimizer_cuda_graph``: megatron-core then builds TE's
    ``FusedAdam`` with ``capturable=True`` (a device learning rate and step, another kernel, 1-2 fp32 ulps from the
    default one); :func:`optimizer_step_graph` adds the graph itself."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    config = OptimizerConfig(
        optimizer="adam",
        lr=lr,
        min_lr=lr,
        weight_decay=weight_decay,
        bf16=True,
        params_dtype=torch.bfloat16,
        use_distributed_optimizer=True,
        clip_grad=1.0,
        adam_beta1=0.9,
        adam_beta2=0.95,
        optimizer_cuda_graph=optimizer_cuda_graph,
    )
    return get_megatron_optimizer(config, model, use_gloo_process_groups=False, pg_collection=pg_collection)


@contextlib.contextmanager
def optimizer_step_graph(optimizer, *, capture_at: int) -> Iterator[None]:
    """The optimizer step under megatron-core's ``OptimizerCudaGraphWrapper``, installed as Megatron-Bridge 0.6.2's
    ``train()`` installs it for ``optimizer.optimizer_cuda_graph=true`` (``train.py``): eager for the first
    ``capture_at`` calls, captured and replayed at that call, replayed after. The wrapper keeps its graph, result
    and call count on the class (one per process); on exit they are cleared as Bridge's ``_delete_cuda_graphs``
    clears them, and the count too, so that a later optimizer in the same process captures again."""
    from megatron.core.optimizer.optimizer_cuda_graph import OptimizerCudaGraphWrapper

    if OptimizerCudaGraphWrapper.cuda_graph is not None:
        raise RuntimeError("another optimizer graph is alive in this process (megatron-core keeps one per class)")
    OptimizerCudaGraphWrapper.curr_iteration = 0
    optimizer.step = OptimizerCudaGraphWrapper(optimizer.step, cuda_graph_warmup_steps=capture_at)
    try:
        yield
    finally:
        del optimizer.step  # the instance attribute: the class's step again
        OptimizerCudaGraphWrapper.cuda_graph = None
        OptimizerCudaGraphWrapper.result = None
        OptimizerCudaGraphWrapper.curr_iteration = 0


def _loss_func(batch: dict, output: torch.Tensor):
    loss = masked_mean(output.float(), batch)
    return loss, {"lm loss": loss.detach()}


def _forward_step(data_iterator, model):
    """Bridge's step on a batch it has already moved: the model on its arguments inside the micro-batch's context with
    the collate's CPU grids, as Bridge's loop runs its step (:func:`bridge_cudagraph.bridge.data_path.
    observing_forward_step`)."""
    batch = next(data_iterator)
    with open_micro_batch(batch.get(CPU_GRIDS)):
        out = model(**model_kwargs(batch))
    if isinstance(out, tuple):
        out = out[0]
    return out, functools.partial(_loss_func, batch)


def prepare_finalize(model: list[torch.nn.Module]) -> None:
    """Give ``model``'s config megatron-core's ``finalize_model_grads`` and the vision replicas' gradient average, as
    Bridge's set-up does (``setup.py``, then :class:`~bridge_cudagraph.bridge.mixin.CudaGraphProviderMixin`'s
    wrap).

    Once per model: :func:`train_steps` calls it while the config has no function yet. Each call walks every module
    of the model (to find the encoder), CPU time Bridge's loop pays once and a step must not (the benchmark calls
    :func:`train_steps` once per step)."""
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.utils import get_model_config

    from bridge_cudagraph.host.replica_sync import install_grad_sync
    from bridge_cudagraph.vision.encoder import GraphedQwen3VLVisionModel

    config = get_model_config(model[0])
    if not getattr(config.finalize_model_grads_func, "_bridge_cudagraph_replica_sync", False):
        config.finalize_model_grads_func = finalize_model_grads
    install_grad_sync(config, model, GraphedQwen3VLVisionModel)


def train_steps(
    model: list[torch.nn.Module],
    optimizer,
    steps: Iterable[list[dict]],
    *,
    pg_collection,
    on_step=None,
    grad_norms: list | None = None,
    forward_backward_func: Callable[..., list] | None = None,
) -> list[float]:
    """Run optimizer steps through Megatron's real schedule; each item of ``steps`` is one step's micro-batches.

    ``on_step(i)`` runs before step ``i`` (the place Bridge's loop captures graphs). Returns the loss per step
    (the last pipeline stage's; NaN elsewhere); ``grad_norms``, when a list, receives the optimizer's grad norms.
    ``forward_backward_func``: what runs the schedule instead of megatron-core's own function for this pipeline
    size, called with the same keyword arguments (the place Bridge's ``train()`` puts megatron-core's
    ``FullCudaGraphWrapper`` around it).
    """
    from megatron.core.pipeline_parallel.schedules import get_forward_backward_func
    from megatron.core.utils import get_model_config

    config = get_model_config(model[0])
    if config.finalize_model_grads_func is None:
        prepare_finalize(model)
    forward_backward = forward_backward_func or get_forward_backward_func(pp_size=pg_collection.pp.size())
    extra = {}
    if pg_collection.pp.size() > 1:
        from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator

        extra["p2p_communicator"] = P2PCommunicator(pp_group=pg_collection.pp, config=config)
    losses = []
    for i, micro_batches in enumerate(steps):
        if on_step is not None:
            on_step(i)
        for chunk in model:
            chunk.zero_grad_buffer()  # type: ignore[operator]  # DDP's method, read through Module.__getattr__
        optimizer.zero_grad()
        out = forward_backward(
            forward_step_func=_forward_step,
            data_iterator=iter(micro_batches),
            model=model,
            num_microbatches=len(micro_batches),
            seq_length=micro_batches[0]["input_ids"].shape[1],
            micro_batch_size=micro_batches[0]["input_ids"].shape[0],
            forward_only=False,
            pg_collection=pg_collection,
            **extra,
        )
        _, grad_norm, _ = optimizer.step()
        if grad_norms is not None:
            grad_norms.append(float(grad_norm) if grad_norm is not None else float("nan"))
        losses.append(float(sum(o["lm loss"] for o in out) / len(out)) if out else float("nan"))
    return losses
