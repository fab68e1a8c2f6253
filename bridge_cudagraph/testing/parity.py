"""Graphed vs graphs-off comparisons: per-token loss, every parameter gradient, and optimizer steps.

The reference and the graphed model hold identical weights and see identical batches; the numbers these
functions return are what the GPU tests assert and what ``results/`` records.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import torch

#: DESIGN.md's bound where kernels may differ: max abs per-token-loss difference (and gradient relative L2).
LOSS_BOUND = 1e-3
GRAD_BOUND = 1e-3


@dataclass
class Diff:
    """How far two runs are apart."""

    loss_max_abs: float
    loss_rel_l2: float
    loss_exact: bool
    grad_max_rel_l2: float = 0.0
    grad_exact_fraction: float = 1.0
    grad_worst: str = ""

    def within_bound(self) -> bool:
        """DESIGN.md's parity bound."""
        return self.loss_max_abs <= LOSS_BOUND and self.grad_max_rel_l2 <= GRAD_BOUND

    def as_dict(self) -> dict:
        """For JSON."""
        return asdict(self)


def per_token_loss(model: list[torch.nn.Module], batch: dict) -> torch.Tensor:
    """The model's per-token loss ``[b, s]`` (fp32) for ``batch``."""
    kwargs = {k: v for k, v in batch.items() if k != "loss_mask"}
    out = model[0](**kwargs)
    if isinstance(out, tuple):
        out = out[0]
    return out.float()


def masked_mean(loss: torch.Tensor, batch: dict) -> torch.Tensor:
    """Mean per-token loss over the tokens the loss mask keeps."""
    mask = batch.get("loss_mask")
    if mask is None:
        return loss.mean()
    return (loss * mask).sum() / mask.sum().clamp(min=1)


def loss_and_grads(model: list[torch.nn.Module], batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One forward/backward from zeroed gradient buffers; the per-token loss and every parameter's gradient."""
    for chunk in model:
        chunk.zero_grad_buffer()
    loss = per_token_loss(model, batch)
    masked_mean(loss, batch).backward()
    grads = {}
    for name, p in model[0].named_parameters():
        if not p.requires_grad:
            continue
        g = getattr(p, "main_grad", None)
        if g is None:
            g = p.grad
        grads[name] = torch.zeros_like(p, dtype=torch.float32) if g is None else g.detach().float().clone()
    return loss.detach(), grads


def diff_losses(a: torch.Tensor, b: torch.Tensor) -> Diff:
    """Loss part of a :class:`Diff`."""
    d = (a - b).abs()
    rel = float((a - b).norm() / b.norm().clamp(min=1e-12))
    return Diff(float(d.max()), rel, bool(torch.equal(a, b)))


def diff(a: tuple[torch.Tensor, dict], b: tuple[torch.Tensor, dict]) -> Diff:
    """Compare ``loss_and_grads`` outputs of the graphed run ``a`` against the reference ``b``."""
    out = diff_losses(a[0], b[0])
    if set(a[1]) != set(b[1]):
        raise AssertionError(f"parameter names differ: {sorted(set(a[1]) ^ set(b[1]))[:5]}")
    exact, worst, worst_name = 0, 0.0, ""
    for name, gb in b[1].items():
        ga = a[1][name]
        if torch.equal(ga, gb):
            exact += 1
            continue
        rel = float((ga - gb).norm() / gb.norm().clamp(min=1e-12))
        if rel > worst:
            worst, worst_name = rel, name
    out.grad_max_rel_l2 = worst
    out.grad_exact_fraction = exact / max(1, len(b[1]))
    out.grad_worst = worst_name
    return out


def megatron_optimizer(model: list[torch.nn.Module], pg_collection, *, lr: float = 1e-4):
    """Bridge's default fine-tuning optimizer: distributed Adam in bf16 with fp32 main params, clip 1.0."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    config = OptimizerConfig(
        optimizer="adam",
        lr=lr,
        min_lr=lr,
        weight_decay=0.0,
        bf16=True,
        params_dtype=torch.bfloat16,
        use_distributed_optimizer=True,
        clip_grad=1.0,
        adam_beta1=0.9,
        adam_beta2=0.95,
    )
    return get_megatron_optimizer(config, model, use_gloo_process_groups=False, pg_collection=pg_collection)


def _loss_func(batch: dict, output: torch.Tensor):
    loss = masked_mean(output.float(), batch)
    return loss, {"lm loss": loss.detach()}


def _forward_step(data_iterator, model):
    batch = next(data_iterator)
    kwargs = {k: v for k, v in batch.items() if k != "loss_mask"}
    out = model(**kwargs)
    if isinstance(out, tuple):
        out = out[0]
    return out, functools.partial(_loss_func, batch)


def train_steps(
    model: list[torch.nn.Module],
    optimizer,
    steps: Iterable[list[dict]],
    *,
    pg_collection,
    on_step=None,
    grad_norms: list | None = None,
) -> list[float]:
    """Run optimizer steps through Megatron's real schedule; each item of ``steps`` is one step's micro-batches.

    ``on_step(i)`` runs before step ``i`` (the place Bridge's loop captures graphs). Returns the loss per step
    (the last pipeline stage's; NaN elsewhere); ``grad_norms``, when a list, receives the optimizer's grad norms.
    """
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.pipeline_parallel.schedules import get_forward_backward_func
    from megatron.core.utils import get_model_config

    from bridge_cudagraph.replicas import install_grad_sync

    config = get_model_config(model[0])
    if not getattr(config.finalize_model_grads_func, "_bridge_cudagraph_replica_sync", False):
        config.finalize_model_grads_func = finalize_model_grads
    install_grad_sync(config, model)
    forward_backward = get_forward_backward_func(pp_size=pg_collection.pp.size())
    extra = {}
    if pg_collection.pp.size() > 1:
        from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator

        extra["p2p_communicator"] = P2PCommunicator(pp_group=pg_collection.pp, config=config)
    losses = []
    for i, micro_batches in enumerate(steps):
        if on_step is not None:
            on_step(i)
        for chunk in model:
            chunk.zero_grad_buffer()
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
