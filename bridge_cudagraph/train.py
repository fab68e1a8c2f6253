"""Train with Megatron-Bridge's own loop and the plugin's graphs: what ``bridge-cudagraph train`` runs.

Nothing here replaces Bridge's loop. :func:`run` installs :mod:`bridge_cudagraph.bridge_loop` (so Bridge's own
language capture stays inert), adds :class:`~bridge_cudagraph.callback.CudaGraphCallback` (which owns capture,
hooks, counters and teardown), picks Bridge's forward step for the model family, and calls Bridge's
``pretrain()``, or ``finetune()`` when the recipe names a pretrained checkpoint. Under ``torchrun`` every rank
runs it; Bridge initialises ``torch.distributed`` from the environment.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from bridge_cudagraph import bridge_loop
from bridge_cudagraph.callback import CudaGraphCallback


def forward_step_for(model_config: Any) -> Callable:
    """Bridge's forward step for the provider: ``qwen3_vl_step`` for Qwen3-VL (dense and MoE), else ``gpt_step``."""
    from megatron.bridge.models.qwen_vl.qwen3_vl_provider import Qwen3VLModelProvider, Qwen3VLMoEModelProvider

    if isinstance(model_config, Qwen3VLModelProvider | Qwen3VLMoEModelProvider):
        from megatron.bridge.models.qwen_vl.qwen3_vl_step import forward_step
    else:
        from megatron.bridge.training.gpt_step import forward_step
    return forward_step


def run(config: Any, *, callbacks: Sequence[Any] = (), forward_step_func: Callable | None = None) -> None:
    """Run Bridge's training loop on ``config`` (a ``ConfigContainer``) with the plugin's graph lifecycle.

    Args:
        config: The Bridge ``ConfigContainer`` (e.g. ``load_recipe(...).config``); Bridge validates it.
        callbacks: More Bridge callbacks, fired after the plugin's.
        forward_step_func: Override of :func:`forward_step_for`.
    """
    from megatron.bridge.training.finetune import finetune
    from megatron.bridge.training.pretrain import pretrain
    from megatron.bridge.utils.common_utils import print_rank_0

    from bridge_cudagraph.compat import use_prebuilt_dataset_helpers

    bridge_loop.install()
    use_prebuilt_dataset_helpers()
    graph_callback = CudaGraphCallback()
    step = forward_step_func or forward_step_for(config.model)
    finetuning = config.checkpoint.pretrained_checkpoint is not None
    entry = finetune if finetuning else pretrain
    block = getattr(config.model, "cuda_graph", None)
    graphs = "not a bridge_cudagraph provider"
    if block is not None:
        graphs = " ".join(f"{n}={'on' if getattr(block, n).enabled else 'off'}" for n in ("language", "vision"))
    print_rank_0(
        f"bridge_cudagraph: Megatron-Bridge {entry.__name__}() of {type(config.model).__name__} "
        f"({config.train.train_iters} iterations, graphs: {graphs}); process groups, model, optimizer and data "
        "are set up first, which can take a few minutes on large models"
    )
    started = time.perf_counter()
    entry(config, forward_step_func=step, callbacks=[graph_callback, *callbacks])
    print_rank_0(f"bridge_cudagraph: {entry.__name__}() finished in {time.perf_counter() - started:.0f} s")


def main(loaded: Any, args: Any = None) -> int:
    """The CLI's ``train`` verb: ``loaded`` is a ``LoadedRecipe`` (its ``.config`` a ``ConfigContainer`` with every
    YAML and command-line override applied); ``args``, the parsed command line, is not needed today."""
    run(loaded.config)
    return 0
