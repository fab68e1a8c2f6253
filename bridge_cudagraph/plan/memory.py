"""Per-rank GPU memory of a planned run: weights, gradients, optimizer state and each submodule's graph pool, in bytes.

Pure arithmetic on the plan's numbers (no torch, no GPU), so ``plan`` and ``validate`` can say on a laptop whether a
run fits an 80 GB H100, and ``train`` can refuse before the first step when it does not fit the device it has.

What a graph pool holds (:func:`~bridge_cudagraph.capture.ladder_capture.capture_budget_ladder`): the activations one
micro-batch saves between forward and backward at the largest captured shape, for every layer the rank graphs; the
static inputs (shared by the rungs of a ladder); and per rung what that rung keeps (its gradient-output buffer and
its last gradient input). Weights whose gradient TE does not fuse into ``main_grad`` add one set of parameter
gradients, which the rungs share; in a packed ladder, which gives them back to the pool, a share of the widest
graph's (:data:`GRADIENTS_HELD`). The activation bytes per token and layer follow the layer's saved tensors
(inputs of both norms and of every GEMM, the attention output, the pre-norm queries and keys where Qwen3 normalises
them, the MLP's intermediate ones), times :data:`ACTIVATION_SLACK` for what the count leaves out (norm and softmax
statistics, rotary tables, workspaces, the caching allocator's rounding). Against the capture's measured pools the
estimate is compared by the benchmark (and by ``tests/unit/plan/test_memory.py`` against recorded captures).

A packed ladder's captured top follows the data (:class:`~bridge_cudagraph.capture.budget_ladder.BudgetLadder`); the
plan cannot know the data, so its estimate is for the ladder's top: an upper bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from bridge_cudagraph.plan.capture_plan import GIB, MemoryEstimate

if TYPE_CHECKING:
    from bridge_cudagraph.plan.capture_plan import CapturePlan
    from bridge_cudagraph.plan.facts import ModelFacts, VisionFacts

#: Saved activations the per-layer count of :func:`language_activation_bytes` leaves out, as a factor: norm and
#: softmax statistics, rotary tables, workspaces, the allocator's rounding. Calibrated on the captures of the
#: Qwen3-VL-2B shape (language and vision pools within 10% of the measured ones; the benchmark's memory section).
ACTIVATION_SLACK = 1.1

#: The share of one graph's unfused weight gradients a packed ladder's pool still holds at its peak. A ladder is
#: captured with TE's clone of those gradients, under which TE gives their buffers back to the pool
#: (:func:`~bridge_cudagraph.capture.ladder_capture.capture_budget_ladder`; the replays then sum them in graphs of
#: their own, :mod:`bridge_cudagraph.capture.param_grads`, which take no pool memory), but within one graph's backward
#: every layer's gradient is alive at its end, and the activations it frees meanwhile come in other sizes, so the pool
#: cannot place all of them there: a graph over a run of layers (the ``run`` unit) holds far more of them at
#: once than a graph of one layer. Calibrated on the 2B shape's captures (the useful-tokens benchmark's memory
#: section): with TE's fused weight-gradient accumulation (no gradients in the pool) the top rung of 1408 tokens took
#: 2.92 GiB, the estimate's activations alone; without it 4.16 GiB, half of the 2.34 GiB of the 25-layer run's
#: gradients more.
GRADIENTS_HELD = 0.5

#: Bytes of an activation element per dtype name of the plan.
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True, slots=True)
class TrainingFacts:
    """What the training setup adds to the memory of the weights (read off the ``ConfigContainer``).

    Attributes:
        dp: Data-parallel size of the language model (the distributed optimizer shards its state over it).
        distributed_optimizer: ``optimizer.use_distributed_optimizer``.
        grad_bytes: Bytes of one gradient-buffer element: 4 with ``ddp.grad_reduce_in_fp32``, else 2.
        peft: A PEFT recipe (LoRA): the base weights are frozen, so they have no gradient and no optimizer state.
    """

    dp: int = 1
    distributed_optimizer: bool = True
    grad_bytes: int = 4
    peft: bool = False


# --------------------------------------------------------------------------------------------- parameters
def _ffn(facts: ModelFacts) -> int:
    return facts.ffn_hidden_size or 4 * facts.hidden_size


def language_layer_params(facts: ModelFacts, *, attention_only: bool = False) -> int:
    """Parameters of one dense decoder layer on one tensor-parallel rank (attention, MLP, norms); with
    ``attention_only``, of its attention half (the input norm and the attention), what a packed MoE layer's graph
    holds."""
    h, d, tp = facts.hidden_size, facts.kv_channels, facts.tp
    q, kv = facts.num_attention_heads * d, (facts.num_query_groups or facts.num_attention_heads) * d
    f = _ffn(facts)
    attention = h * (q + 2 * kv) + q * h
    if attention_only:
        return attention // tp + 2 * h
    mlp = h * f * (2 if facts.gated_linear_unit else 1) + f * h
    return (attention + mlp) // tp + 4 * h


def vision_params(v: VisionFacts, tp: int = 1) -> int:
    """Parameters of the vision encoder (layers, the patch mergers, the patch and position embeddings)."""
    h, f = v.hidden_size, v.intermediate_size or 4 * v.hidden_size
    layer = (4 * h * h + 2 * h * f) // tp + 4 * h
    merged = h * v.merge_unit
    merger = (merged * merged + merged * (v.out_hidden_size or h)) // tp
    patch = 3 * v.temporal_patch_size * v.patch_size**2 * h
    return (
        v.depth * layer + (1 + len(v.deepstack_visual_indexes)) * merger + patch + (v.num_position_embeddings or 0) * h
    )


def stage0_language_params(facts: ModelFacts, layers: int) -> int:
    """The language parameters of pipeline stage 0: its layers and the embedding (and the output layer when
    pp is 1 and the embeddings are not tied)."""
    embedding = facts.vocab_size * facts.hidden_size // facts.tp
    output = 0 if facts.share_embeddings_and_output_weights or facts.pp > 1 else embedding
    return layers * language_layer_params(facts) + embedding + output


# -------------------------------------------------------------------------------------------- activations
def language_activation_bytes(facts: ModelFacts, *, attention_only: bool = False) -> int:
    """Bytes one token saves for backward in one dense decoder layer (see the module docstring); with
    ``attention_only``, in its attention half (the input norm's and the attention's saved tensors), what a packed
    MoE layer's graph saves (its MLP half runs eagerly, its activations eager's own)."""
    h, d, tp = facts.hidden_size, facts.kv_channels, facts.tp
    sp = facts.sequence_split
    q, kv = facts.num_attention_heads * d, (facts.num_query_groups or facts.num_attention_heads) * d
    f = _ffn(facts)
    qk_norm = (q + kv) / tp if facts.qk_layernorm else 0
    mlp = 0 if attention_only else (f * (2 if facts.gated_linear_unit else 1) + f) / tp
    elements = (2 if attention_only else 4) * h / sp + (q + 2 * kv + q) / tp + qk_norm + mlp
    return int(elements * DTYPE_BYTES.get(facts.dtype, 2) * ACTIVATION_SLACK)


def vision_activation_bytes(v: VisionFacts, tp: int = 1, dtype: str = "bf16") -> int:
    """Bytes one patch saves for backward in one vision layer (full attention heads, a GELU MLP)."""
    h, f = v.hidden_size, v.intermediate_size or 4 * v.hidden_size
    elements = 4 * h + 4 * h / tp + 2 * f / tp
    return int(elements * DTYPE_BYTES.get(dtype, 2) * ACTIVATION_SLACK)


def ladder_pool_bytes(
    per_unit: int, layers: int, budgets: tuple[int, ...], width: int, segments: int, *, dtype_bytes: int
) -> int:
    """One copy of a budget ladder's pool: the top rung's activations (``per_unit`` bytes per token or patch and
    layer), the shared static inputs (one hidden-state buffer per graph of a rung), and per rung its gradient-output
    buffer and last gradient input (``width`` elements a row)."""
    top = budgets[-1]
    kept = sum(2 * b * width * dtype_bytes for b in budgets)
    return per_unit * layers * top + segments * top * width * dtype_bytes + kept


# ---------------------------------------------------------------------------------------------- estimate
def estimate(plan: CapturePlan, training: TrainingFacts | None = None) -> MemoryEstimate:
    """The :class:`MemoryEstimate` of ``plan``'s busiest rank; ``training`` defaults to :class:`TrainingFacts`."""
    training = training or TrainingFacts()
    f = plan.facts
    dtype_bytes = DTYPE_BYTES.get(f.dtype, 2)
    layers = plan.language.layers_per_stage[0] if plan.language.layers_per_stage else f.num_layers
    language = stage0_language_params(f, layers)
    vision_tp = plan.vision_layout.tp if plan.vision_layout is not None else 1
    vision = vision_params(f.vision, vision_tp) if f.vision is not None else 0
    params = language + vision
    weights = params * 2
    trainable = 0 if training.peft else params
    gradients = trainable * training.grad_bytes
    optimizer = trainable * 12 // (training.dp if training.distributed_optimizer else 1)
    tokens = plan.micro_batch_size * f.seq_length // f.cp
    logits = tokens * (f.vocab_size // f.tp) * 6 if f.pp == 1 else 0

    language_graphs = language_top = 0
    lang = plan.language
    # Whole layers on the ladder (packed or padded), or of MoE layers the attention half (MOE_ATTENTION_SCOPE).
    ladder = lang.ladder
    if lang.enabled and lang.captured_per_stage and ladder is not None:
        attention_only = lang.modules == ("attn",)
        per_token = language_activation_bytes(f, attention_only=attention_only)
        captured = lang.captured_per_stage[0]
        fused = f.gradient_accumulation_fusion or training.peft  # PEFT: the frozen base weights have no gradient
        # A ladder gives its unfused parameter gradients back to the pool; part of the largest graph's stay in it
        # (GRADIENTS_HELD).
        spans = lang.segments_per_stage[0] if lang.segments_per_stage else ()
        widest = max((end - start for start, end in spans), default=1)
        held = language_layer_params(f, attention_only=attention_only)
        unfused = 0 if fused else int(GRADIENTS_HELD * widest * held * dtype_bytes)
        budgets = ladder.token_budgets
        segments = len(spans) or captured
        per_copy = ladder_pool_bytes(
            per_token,
            captured,
            tuple(b // f.sequence_split for b in budgets),
            f.hidden_size,
            segments,
            dtype_bytes=dtype_bytes,
        )
        workspace = lang.packed.deterministic_workspace if lang.packed is not None else 0
        language_graphs = (per_copy + unfused + workspace) * ladder.copies
        language_top = budgets[-1]
    vision_graphs = vision_top = 0
    vplan = plan.vision
    if vplan is not None and vplan.enabled and f.vision is not None:
        v = f.vision
        per_patch = vision_activation_bytes(v, vision_tp, f.dtype)
        budgets = vplan.token_budgets
        per_copy = ladder_pool_bytes(
            per_patch, v.depth, budgets, v.hidden_size, len(vplan.segments) or v.depth, dtype_bytes=dtype_bytes
        )
        vision_graphs = (per_copy + vplan.deterministic_workspace) * vplan.copies
        vision_top = budgets[-1]
    return MemoryEstimate(
        weights=weights,
        gradients=gradients,
        optimizer=optimizer,
        logits=logits,
        language_graphs=int(language_graphs),
        vision_graphs=int(vision_graphs),
        language_top=language_top,
        vision_top=vision_top,
        language_ladder=lang.enabled and lang.packed is not None,  # the padded ladder's one rung cannot be lowered
    )


def pool_estimate(plan: CapturePlan, submodule: str, top: int) -> int:
    """The estimate of one submodule's graph pool when its ladder's captured top is ``top`` (what the benchmark sets
    against a capture's measured memory)."""
    import dataclasses

    if submodule == "language" and plan.language.packed is not None:
        budgets = tuple(b for b in plan.language.packed.token_budgets if b <= top) or (top,)
        packed = dataclasses.replace(plan.language.packed, token_budgets=budgets)
        plan = dataclasses.replace(plan, language=dataclasses.replace(plan.language, packed=packed))
        return estimate(plan).language_graphs
    if submodule == "vision" and plan.vision is not None:
        budgets = tuple(b for b in plan.vision.token_budgets if b <= top) or (top,)
        plan = dataclasses.replace(plan, vision=dataclasses.replace(plan.vision, token_budgets=budgets))
        return estimate(plan).vision_graphs
    return getattr(estimate(plan), f"{submodule}_graphs")


def check_fits(memory: MemoryEstimate, capacity_gib: float, *, graphs_on: bool, source: str) -> None:
    """Refuse, with one line naming the settings to change, a run whose estimate exceeds ``capacity_gib``.

    ``source`` says where the capacity came from (``--gpu-memory 80``, or the device's own size)."""
    from bridge_cudagraph.config import CudaGraphConfigError

    capacity = capacity_gib * GIB
    need = memory.total if graphs_on else memory.static + memory.logits
    if need <= capacity:
        return
    fixes = []
    if memory.language_graphs and memory.language_ladder:
        fixes.append(f"model.cuda_graph.language.token_budgets below {memory.language_top} tokens")
    if memory.vision_graphs:
        fixes.append(f"model.cuda_graph.vision.token_budgets below {memory.vision_top} patches")
    fixes.append("train.micro_batch_size or model.seq_length lower, or more ranks (model.tensor_model_parallel_size)")
    raise CudaGraphConfigError(
        f"the run needs about {need / GIB:.1f} GiB per rank (graph pools {memory.graphs / GIB:.1f}, weights, "
        f"gradients and optimizer {memory.static / GIB:.1f}, logits {memory.logits / GIB:.1f}) but {source} gives "
        f"{capacity_gib:g} GiB; set " + "; or ".join(fixes)
    )


def check_plan_fits(plan: CapturePlan, capacity_gib: float, *, source: str) -> None:
    """:func:`check_fits` on ``plan``'s estimate, with graphs on where the plan captures any (nothing to check for a
    plan built without the training facts)."""
    if plan.memory is None:
        return
    graphs_on = plan.language.enabled or (plan.vision is not None and plan.vision.enabled)
    check_fits(plan.memory, capacity_gib, graphs_on=graphs_on, source=source)
