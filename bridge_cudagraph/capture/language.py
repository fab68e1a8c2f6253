"""Language-model capture that replays exactly what the eager layers compute.

Built on megatron-core's ``TECudaGraphHelper`` and changed at three narrow points:

1. **Every input a layer reads at replay is a captured input.** The helper adds ``rotary_pos_emb`` to a
   layer's static inputs only for ``position_embedding_type == "rope"``. Qwen3-VL's language model uses
   ``"mrope"`` (positions that depend on the batch's text and image layout), and TE's replay silently
   ignores keyword arguments that were absent at capture (``graph.py`` ``functionalized``), so upstream's
   replayed layers run *without* rotary embeddings: per-token loss off by up to 0.44 on a tiny Qwen3-VL.
   Here the mRoPE tensor, shape ``(S/cp, micro_batch, 1, rotary_dim)`` in fp32, is a static input that
   each replay refreshes from the model's own computation.
2. **Static inputs follow the model's activation dtype**, not the hard-coded bf16 of ``module.py``.
3. **The micro-batch count is the plugin's**
   (:func:`~bridge_cudagraph.host.num_microbatches.explicit_num_microbatches`), so no process-global micro-batch
   calculator is needed, and the collection is mandatory (no fallback to ``parallel_state``).

It also checks static shapes against the groups before capture, keeps Qwen3-VL's checkpoint keys
unchanged (:func:`drop_language_aliases`), can capture again after :meth:`delete_cuda_graphs` (resume),
and turns a failed capture into an eager run when asked.

The plan sends padded micro-batches here only where the ladder engine (:mod:`bridge_cudagraph.capture.padded`) does
not capture them yet: parts of layers (``language.modules``, the MoE scope), MoE layers, virtual pipeline chunks, and
the decoder's per-layer contexts (FP8, offloading); always one graph per layer
(:func:`~bridge_cudagraph.plan.build._megatron_engine_reason`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from megatron.core.transformer.cuda_graphs import TECudaGraphHelper
from megatron.core.transformer.enums import CudaGraphModule
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.transformer_layer import TransformerLayer

from bridge_cudagraph.capture.checks import CaptureError, check_group_sizes, check_static_inputs
from bridge_cudagraph.capture.device_memory import measure
from bridge_cudagraph.capture.failure import abandon_capture
from bridge_cudagraph.capture.static_inputs import activation_dtype
from bridge_cudagraph.capture.stats import CaptureStats
from bridge_cudagraph.host.num_microbatches import explicit_num_microbatches

if TYPE_CHECKING:
    from bridge_cudagraph.plan.capture_plan import StaticInput

logger = logging.getLogger("bridge_cudagraph")


def language_model_of(chunk):
    """The module that owns the decoder, rotary embedding and position type: the chunk itself for GPT,
    ``chunk.language_model`` for Qwen3-VL (unwrapping DDP / Float16Module first)."""
    module = chunk
    while not hasattr(module, "decoder") and hasattr(module, "module"):
        module = module.module
    return getattr(module, "language_model", None) or module


def drop_language_aliases(model) -> None:
    """Undo Bridge 0.6.2's registration of ``language_model.decoder`` / ``.rotary_pos_emb`` as children of
    the Qwen3-VL root (done when language graphs are on), which duplicates 95 state-dict keys of a tiny model
    under ``decoder.*`` and changes checkpoints.

    The root keeps its read-only ``decoder`` property (so ``get_attr_wrapped_model(chunk, "decoder")`` still
    finds the layers) and the plain ``position_embedding_type`` string; only the module registrations go.
    """
    modules = getattr(model, "_modules", {})
    language = getattr(model, "language_model", None)
    if language is None:
        return
    for name in ("decoder", "rotary_pos_emb"):
        if modules.get(name) is not None and modules[name] is getattr(language, name, None):
            del modules[name]


def _layer_has_graphed_attention(layer, config) -> bool:
    """Mirror of the helper's own test (``cuda_graphs.py`` ``_get_layer_static_inputs``)."""
    return (
        isinstance(layer, TransformerLayer)
        and not isinstance(layer.self_attention, IdentityOp)
        and (not config.cuda_graph_modules or CudaGraphModule.attn in config.cuda_graph_modules)
    )


class LanguageGraphHelper(TECudaGraphHelper):
    """Per-layer TE graphs of a GPT-family or Qwen3-VL language model under an explicit collection.

    Args:
        model: The model chunks (DDP-wrapped, as Bridge and Megatron build them).
        config: The language ``TransformerConfig`` (for Bridge, the provider itself).
        seq_length: Full sequence length of every training micro-batch (static).
        micro_batch_size: Micro-batch size (static).
        num_microbatches: Micro-batches per step: the capture schedule under pipeline parallelism.
        pg_collection: The language model's ``ProcessGroupCollection``; required.
        static_inputs: The plan's static inputs (:class:`~bridge_cudagraph.plan.capture_plan.StaticInput`) of
            every layer; megatron-core's helper allocates the buffers, and each is checked against them before capture.
        optimizers: Optimizers whose gradients capture's warmup iterations must clear.
        on_capture_error: ``"eager"`` to continue without graphs after a failed capture, ``"raise"`` to stop.
        graph_unit: ``layer``, megatron-core's unit (the plan resolves every capture of this helper to it).
        deepstack_merges: Unused here (runs of layers are the ladder's); kept so that the plan's arguments fit both.
    """

    submodule = "language"

    def __init__(
        self,
        model,
        config,
        *,
        seq_length: int,
        micro_batch_size: int,
        num_microbatches: int,
        pg_collection,
        static_inputs: Sequence[StaticInput] = (),
        optimizers=(),
        on_capture_error: str = "eager",
        graph_unit: str = "layer",
        deepstack_merges: int = 0,
    ) -> None:
        if pg_collection is None:
            raise CaptureError(
                "LanguageGraphHelper needs the language model's ProcessGroupCollection (pg_collection=...); "
                "it never falls back to parallel_state globals"
            )
        check_group_sizes(config, pg_collection, self.submodule)
        if getattr(config, "overlap_moe_expert_parallel_comm", False):
            raise CaptureError(
                "language: model.overlap_moe_expert_parallel_comm=True reorders capture per layer, which this "
                "plugin does not support yet; set it to false or disable model.cuda_graph.language"
            )
        if num_microbatches < 1:
            raise CaptureError(f"language: num_microbatches must be >= 1, got {num_microbatches}")
        self.explicit_num_microbatches = num_microbatches
        self.planned_inputs = tuple(static_inputs)
        self.on_capture_error = on_capture_error
        # TE's clone of the returned parameter gradients stays on: megatron-core's DDP consumes them on its own
        # stream, unordered with the next replays, which TE's shared pool lets write the same memory
        # (capture.ladder_capture.capture_budget_ladder says how).
        self.stats = CaptureStats(self.submodule, param_grads_cloned=True)
        super().__init__(
            model,
            config,
            seq_length,
            micro_batch_size,
            optimizers=list(optimizers),
            pg_collection=pg_collection,
        )
        self.stats.layers = len(self.flattened_callables)
        if graph_unit != "layer":
            raise CaptureError(
                f"language: graph_unit={graph_unit!r} on megatron-core's helper; runs of layers are captured by the "
                "ladder (capture.padded), so set model.cuda_graph.language.graph_unit=layer"
            )

    # ----------------------------------------------------------------- static inputs
    def _get_sample_arguments(self, order, chunk_id_list=None):
        sample_args, sample_kwargs = super()._get_sample_arguments(order, chunk_id_list)
        dtype = activation_dtype(self.config)
        retyped: dict[int, torch.Tensor] = {}

        def retype(t):
            if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dtype == dtype:
                return t
            if id(t) not in retyped:  # keep the helper's buffer sharing between (layer, micro-batch) pairs
                retyped[id(t)] = t.detach().to(dtype).requires_grad_(t.requires_grad)
            return retyped[id(t)]

        sample_args = [tuple(retype(a) for a in args) for args in sample_args]

        mrope_cache: dict[int, torch.Tensor] = {}
        done: set[int] = set()
        for index, chunk_index, layer in self._indexed_layers():
            kwargs = sample_kwargs[index]
            if id(kwargs) in done or not _layer_has_graphed_attention(layer, self.config):
                continue
            done.add(id(kwargs))
            language = language_model_of(self.chunks_with_decoder[chunk_index])
            if getattr(language, "position_embedding_type", None) == "mrope" and "rotary_pos_emb" not in kwargs:
                if chunk_index not in mrope_cache:
                    mrope_cache[chunk_index] = self._static_mrope(language)
                kwargs["rotary_pos_emb"] = mrope_cache[chunk_index]
        for args, kwargs in zip(sample_args, sample_kwargs, strict=True):
            check_static_inputs({"hidden_states": args[0], **kwargs}, self.planned_inputs, self.submodule)
        return sample_args, sample_kwargs

    def _indexed_layers(self):
        """``(sample index, chunk index, layer)`` for every captured (layer, micro-batch), in the helper's
        index layout ``prefix_layers[c] * num_mb + mb * layers[c] + l`` (``cuda_graphs.py``)."""
        prefix = 0
        for chunk_index, layers in enumerate(self.callables_per_chunk):
            for mb in range(self.num_microbatches):
                for layer_index, layer in enumerate(layers):
                    yield prefix * self.num_microbatches + mb * len(layers) + layer_index, chunk_index, layer
            prefix += len(layers)

    def _static_mrope(self, language) -> torch.Tensor:
        """A correctly shaped mRoPE buffer: ``(S/cp, mbs, 1, rotary_dim)`` fp32, from text-only positions.

        Its values only matter for TE's warmup passes; every replay copies the real embedding in.
        """
        seq = torch.arange(self.seq_length, device=torch.cuda.current_device())
        position_ids = seq.view(1, 1, -1).expand(3, self.micro_batch_size, -1)
        with torch.no_grad():
            emb = language.rotary_pos_emb(position_ids, language.mrope_section)
        return emb.detach().contiguous()

    # ------------------------------------------------------------------ lifecycle
    def create_cudagraphs(self):
        """Capture with the plugin's micro-batch count; on failure either raise or train on eagerly."""
        self._capture_finished = False  # allow a second capture after delete_cuda_graphs (resume)
        try:
            with measure(self.stats), explicit_num_microbatches(self.explicit_num_microbatches):
                super().create_cudagraphs()
        except Exception as error:
            if self.on_capture_error == "raise":
                raise
            self.stats.failed = abandon_capture(self.flattened_callables, self.model, error, self.submodule)
            self._graphs_created = False
            self._capture_finished = True
            return
        self.stats.graphs = sum(len(layer.cuda_graphs) for layer in self.flattened_callables)
        self._count_replays()

    def _count_replays(self) -> None:
        """Count micro-batches whose decoder runs on the graphs (training mode, graphs present): a forward
        pre-hook on each decoder, removed again by :meth:`delete_cuda_graphs`."""
        self._replay_hooks = []
        for chunk, layers in zip(self.chunks_with_decoder, self.callables_per_chunk, strict=True):
            if chunk is None or not layers:
                continue

            def count(module, args, first=layers[0]):
                if module.training and first.cuda_graphs:
                    self.stats.replays += 1

            self._replay_hooks.append(chunk.decoder.register_forward_pre_hook(count))

    def delete_cuda_graphs(self):
        """Free every graph (TE ``reset()``), and allow a later re-capture."""
        if self._graphs_created:
            super().delete_cuda_graphs()
        for handle in getattr(self, "_replay_hooks", []):
            handle.remove()
        self._replay_hooks = []
        self._capture_finished = False
        self.stats.graphs = 0
