"""``CudaGraphProviderMixin``: the ``cuda_graph`` recipe block on a Bridge model provider.

Composed in front of any ``GPTModelProvider`` (Qwen3, Llama, ...) or the Qwen3-VL providers
(:mod:`bridge_cudagraph.bridge.providers`). It is a dataclass field, so the YAML block and Hydra-style overrides
(``model.cuda_graph.vision.token_budgets=[...]``) reach it through Bridge's own OmegaConf path without ``+``. It

* turns the block into Megatron-Core's switches at ``finalize()`` (``cuda_graph_impl``, modules, warmup,
  the TE RNG tracker graphs need), refusing upstream's own switches so that exactly one owner captures;
* builds the model with the collection Bridge hands ``provide_distributed_model`` (completed with the GTP_remat
  fields megatron-core reads, :func:`~bridge_cudagraph.host.gtp_remat_aliases.complete_bridge_collection`) and keeps
  the checkpoint keys of a graphs-off model (:func:`~bridge_cudagraph.host.language_aliases.drop_language_aliases`);
* keeps the vision replicas of the model it built identical, graphs or not (:meth:`provide_distributed_model`);
* makes the graph helpers (:meth:`make_graph_helpers`) from a
  :class:`~bridge_cudagraph.plan.capture_plan.CapturePlan`, which holds every number they need (budgets, segments,
  copies, micro-batches, static shapes): nothing is re-derived here.
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from bridge_cudagraph.config import CudaGraphConfig, CudaGraphConfigError
from bridge_cudagraph.host import compat
from bridge_cudagraph.host.instance_class import HostMixin

if TYPE_CHECKING:
    from bridge_cudagraph.plan.capture_plan import CapturePlan

#: ``vision_pg_collection`` was neither given nor derived yet (``None`` is a value: no encoder on this rank).
_NOT_SET = object()


@dataclass
class CudaGraphProviderMixin(HostMixin):
    """Adds the ``cuda_graph`` block to a Megatron-Bridge model provider (put it first in the bases)."""

    cuda_graph: CudaGraphConfig = field(default_factory=CudaGraphConfig)
    """Per-layer CUDA graphs for the language model and the vision encoder; see :mod:`bridge_cudagraph.config`."""

    #: :meth:`provide` builds ``gradient_accumulation_fusion=true`` without APEX
    #: (:mod:`bridge_cudagraph.host.wgrad_fusion`); :func:`bridge_cudagraph.plan.checks.check_stack` reads this
    #: instead of refusing the setting.
    fuses_te_layers_without_apex: ClassVar[bool] = True

    # Process groups stay shared references when Bridge deep-copies a provider (its __deepcopy__ honours this).
    _NO_COPY_KEYS = frozenset({"_pg_collection", "_vision_pg_collection", "_built_chunks"})

    # ------------------------------------------------------------------ config time
    def finalize(self) -> None:
        """Validate the block against this model and set Megatron-Core's switches, then finalize the host."""
        self.apply_cuda_graph_settings()
        super().finalize()

    def apply_cuda_graph_settings(self) -> None:
        """Translate ``cuda_graph`` into the provider's Megatron-Core fields; idempotent."""
        from megatron.bridge.utils.cuda_graph import set_cuda_graph_modules

        cfg = self.cuda_graph
        if isinstance(cfg, dict):  # a plain mapping from a YAML/Hydra path that bypassed our loader
            from bridge_cudagraph.config import cuda_graph_config_from_dict

            cfg = self.cuda_graph = cuda_graph_config_from_dict(cfg, "model.cuda_graph")
        cfg.validate("model.cuda_graph")
        compat.check_proven_stack()
        if cfg.any_enabled:
            from bridge_cudagraph.plan.checks import check_environment

            check_environment()
        # Every check comes before the first change to the provider: a refused block leaves it as it was.
        owned = getattr(self, "_bridge_cudagraph_owns_language", False)  # set by an earlier finalize()
        if self.cuda_graph_impl not in ("none", None) and not owned:
            raise CudaGraphConfigError(
                f"model.cuda_graph_impl={self.cuda_graph_impl!r} is upstream's language-graph switch; with "
                "bridge_cudagraph set model.cuda_graph.language.enabled=true and leave model.cuda_graph_impl "
                "at 'none' (one owner captures each submodule)",
                fix=("model.cuda_graph_impl=none", "model.cuda_graph.language.enabled=true"),
            )
        if getattr(self, "vision_cuda_graph_impl", "none") not in ("none", None):
            raise CudaGraphConfigError(
                f"model.vision_cuda_graph_impl={self.vision_cuda_graph_impl!r} selects upstream's vision graphs, "
                "which attend across images and to padding; set model.cuda_graph.vision.enabled=true instead "
                "and leave model.vision_cuda_graph_impl at 'none'",
                fix=("model.vision_cuda_graph_impl=none", "model.cuda_graph.vision.enabled=true"),
            )
        from bridge_cudagraph.plan.checks import check_model
        from bridge_cudagraph.plan.facts import model_facts

        check_model(model_facts(self), cfg)
        if self.has_vision_encoder():
            self._check_vision()
        if cfg.language.enabled:
            self._check_language_graphable()
        if owned and not cfg.language.enabled:  # switched off after an earlier finalize()
            self.cuda_graph_impl: str | None = "none"  # the host field (megatron-core's TransformerConfig)
            self._bridge_cudagraph_owns_language = False
        if cfg.language.enabled:
            self.cuda_graph_impl = "transformer_engine"
            self._bridge_cudagraph_owns_language = True
            set_cuda_graph_modules(self, list(self._language_modules() or []))
            if cfg.language.warmup_steps is not None:
                self.cuda_graph_warmup_steps = cfg.language.warmup_steps
        if cfg.any_enabled:
            # Graph replay needs TE's graph-safe RNG tracker (else: "'Tensor' object has no attribute
            # 'get_state'" at capture). Bridge keys its RNG set-up on the same flag.
            self.use_te_rng_tracker = True

    def has_vision_encoder(self) -> bool:
        """Whether this provider builds a vision encoder (Qwen3-VL providers override this)."""
        return False

    def _check_vision(self) -> None:
        where = "model.cuda_graph.vision"
        vtp, tp = self.cuda_graph.vision.tensor_parallel_size, self.tensor_model_parallel_size or 1
        if tp % vtp:
            raise CudaGraphConfigError(
                f"{where}.tensor_parallel_size={vtp} does not divide model.tensor_model_parallel_size={tp}: vision "
                f"replicas must line up with language tensor-parallel groups (grad norm); use 1 or a divisor of {tp}",
                fix=("model.cuda_graph.vision.tensor_parallel_size=1",),
            )
        if self.cuda_graph.vision.enabled:
            if getattr(self, "fp16", False) and not getattr(self, "bf16", False):
                raise CudaGraphConfigError(
                    f"{where}.enabled=true with model.fp16=true: Bridge's Qwen3-VL vision path builds its embeddings "
                    f"in bf16; train in bf16 (model.bf16=true) or set {where}.enabled=false",
                    fix=(f"{where}.enabled=false",),
                )

    def _check_language_graphable(self) -> None:
        where = "model.cuda_graph.language"
        if getattr(self, "recompute_granularity", None) == "full":
            raise CudaGraphConfigError(
                f"{where}.enabled=true with model.recompute_granularity='full': full activation recompute "
                "re-runs whole layers outside the graphs; use recompute_granularity='selective' (or null) "
                f"or set {where}.enabled=false",
                fix=("model.recompute_granularity=selective",),
            )
        # Bridge's ConfigContainer.validate marks in-batch packing on the model (and Megatron then varies sequence
        # lengths under a pipeline); packed runs replay the packed graphs, whose budgets the plan decides.
        if getattr(self, "variable_seq_lengths", False) and not compat.in_batch_packing_marked(self):
            raise CudaGraphConfigError(
                f"{where}.enabled=true with model.variable_seq_lengths=true: graphs have static shapes; "
                "pad every micro-batch to model.seq_length (dataset pad_to_max_length=true, no in-batch packing)"
            )

    def _language_modules(self) -> tuple[str, ...] | None:
        """The language scope megatron-core's layers read (``config.cuda_graph_modules``): the block's, or on an MoE
        model with ``modules: null`` the MoE attention scope (:func:`~bridge_cudagraph.plan.checks.language_modules`):
        the attention, the MoE layer's MLP half eager after it."""
        from bridge_cudagraph.plan.checks import language_modules

        return language_modules(self.cuda_graph.language.modules, getattr(self, "num_moe_experts", None))

    # ------------------------------------------------------------------ build time
    def provide(self, pre_process=None, post_process=None, vp_stage=None):
        """Build the host's model, then restore the checkpoint keys language graphs would change.

        ``gradient_accumulation_fusion=true`` on a stack without APEX: the host builds unfused and TE's own layers
        fuse afterwards (:mod:`bridge_cudagraph.host.wgrad_fusion`), graphs or not.
        """
        from bridge_cudagraph.host.language_aliases import drop_language_aliases
        from bridge_cudagraph.host.wgrad_fusion import fuse_te_modules, unfused_build

        with unfused_build(self) as te_only:
            model = super().provide(pre_process=pre_process, post_process=post_process, vp_stage=vp_stage)
        if te_only and not fuse_te_modules(model, self):
            raise RuntimeError(
                "bridge_cudagraph: model.gradient_accumulation_fusion=true, but no Transformer Engine module of the "
                "language model was built from its provider's config; the fusion would be silently off"
            )
        drop_language_aliases(model)
        if self.has_vision_encoder():
            from bridge_cudagraph.host.encoder_swap import rebuild_vision_encoder

            rebuild_vision_encoder(model, self, self.vision_pg_collection())
        return model

    def set_vision_pg_collection(self, pg_collection) -> None:
        """Use ``pg_collection`` for the vision encoder instead of deriving one; ``None`` says this rank holds no
        encoder (a later pipeline stage) and must not join the collective derivation either."""
        self._vision_pg_collection = pg_collection

    def vision_pg_collection(self):
        """The vision encoder's collection: the caller's (:meth:`set_vision_pg_collection`), else derived once from
        the language collection Bridge passed (collective: every rank calls ``provide()``; None off stage 0).

        Whatever a rank was given or derived, ``None`` included, is kept: a rank that derived again, or derived
        while others had been given theirs, would wait in ``new_group`` for ranks that never join (seen on two
        H200s at pipeline size 2, where only stage 0 had an explicit collection).
        """
        pgc = getattr(self, "_vision_pg_collection", _NOT_SET)
        if pgc is not _NOT_SET:
            return pgc
        from bridge_cudagraph.parallel.groups import derive_vision_collection

        language = compat.provider_pg_collection(self)
        if language is None:
            raise RuntimeError("build the model with provide_distributed_model(pg_collection=...) first")
        self._vision_pg_collection = derive_vision_collection(
            language,
            self.cuda_graph.vision.tensor_parallel_size,
            num_attention_heads=self.vision_config.num_heads,
            vision_dp_when_cp=getattr(self, "vision_dp_when_cp", False),
        )
        return self._vision_pg_collection

    def provide_distributed_model(self, *args, **kwargs):
        """Bridge's model construction, then the vision replica gradient sync for the chunks it built.

        Installed here, where the model is built, so a run without graphs keeps identical vision replicas too.
        Bridge sets ``finalize_model_grads_func`` only after this returns (``setup.py``
        ``_update_model_config_funcs``), so the chunks are remembered (weakly) and :meth:`__setattr__` wraps the
        function when it is assigned; one that is already set is wrapped at once.

        The collection Bridge passes (``dist.use_decentralized_pg=true``) is the one its training loop logs with; it
        gets the GTP_remat fields megatron-core's MoE metric logging reads before anything is built from it
        (:func:`bridge_cudagraph.host.gtp_remat_aliases.complete_bridge_collection`).
        """
        pgc = kwargs.get("pg_collection")
        if pgc is not None:
            from bridge_cudagraph.host.gtp_remat_aliases import complete_bridge_collection

            complete_bridge_collection(pgc, self)
        model = super().provide_distributed_model(*args, **kwargs)
        object.__setattr__(self, "_built_chunks", [weakref.ref(chunk) for chunk in model])
        self._sync_vision_replicas()
        return model

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "finalize_model_grads_func" and value is not None:
            self._sync_vision_replicas()

    def _sync_vision_replicas(self) -> None:
        refs = self.__dict__.get("_built_chunks")
        chunks = [ref() for ref in refs or ()]
        if not chunks or any(chunk is None for chunk in chunks):
            return
        from bridge_cudagraph.host.replica_sync import install_grad_sync
        from bridge_cudagraph.vision.encoder import GraphedQwen3VLVisionModel

        # Idempotent: the wrapper it assigns comes back through __setattr__ and is recognised.
        install_grad_sync(self, chunks, GraphedQwen3VLVisionModel)

    def make_language_graph_helper(self, model: list[Any], *, plan: CapturePlan):
        """The language graph helper for ``model`` (the DDP-wrapped chunks this provider built), as ``plan`` says
        (:func:`bridge_cudagraph.capture.from_plan.language_graph_helper`)."""
        from bridge_cudagraph.capture.from_plan import check_plan_matches, language_graph_helper

        check_plan_matches(self, plan)
        return language_graph_helper(model, plan=plan)

    def make_graph_helpers(self, model: list[Any], *, plan: CapturePlan) -> list[Any]:
        """Every helper ``plan`` asks for, language first, for a lifecycle owner (the Bridge callback, a test, the
        benchmark) to drive through the ``TECudaGraphHelper`` protocol: ``create_cudagraphs()``,
        ``graphs_created()``, ``cuda_graph_set_manual_hooks()``, ``delete_cuda_graphs()`` and ``stats``
        (:func:`bridge_cudagraph.capture.from_plan.graph_helpers`)."""
        from bridge_cudagraph.capture.from_plan import graph_helpers

        return graph_helpers(self, model, plan=plan)


def provider_fields(provider: Any) -> dict[str, Any]:
    """The ``init`` fields of a provider dataclass instance, for re-creating it as another class."""
    return {f.name: getattr(provider, f.name) for f in dataclasses.fields(provider) if f.init}
