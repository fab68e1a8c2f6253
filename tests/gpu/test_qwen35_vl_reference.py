"""Qwen3.5-VL on the GPU, the first proof (issue #52): the plugin's providers against Bridge's UNMODIFIED
``Qwen35VLModelProvider`` and ``Qwen35VLMoEModelProvider``, with the language model eager and the vision encoder
eager, then graphed.

Why: nothing of Qwen3.5-VL had run on a GPU (``docs/design/qwen35-vl.md``, section 6, items 0 and 2). The language
graphs stay off, as the plan refuses them over gated-delta-net layers (``plan.checks.check_linear_attention``); what
must hold is that our providers build the hybrid model under explicit groups at all, that the model they build is
Bridge's (same parameters, same numbers), and that the vision graphs replay exactly on an encoder without deepstack.

Two cases, dense and MoE, per-token loss and every parameter gradient compared by name (``testing.parity.diff``):

(1) graphs off: ``CudaGraphQwen35VL[MoE]ModelProvider`` with ``language.enabled=false, vision.enabled=false``;
(2) vision graphs on (language off), after capture, replaying; a capture that fell back to eager, a micro-batch that
    ran eagerly or a graph count other than one per budget fails the test. With Bridge's forward, and with ours
    (``model.cuda_graph.forward``, :mod:`bridge_cudagraph.host.forward`, which a run turns on wherever graphs are:
    mRoPE positions from one host copy, the image-token merge by row positions), every micro-batch counted through it.

The reference. Bridge's provider cannot build a Qwen3.5-VL model under explicit groups: its ``provide()`` asks
megatron-core for the hybrid block spec without a pipeline rank, and megatron-core reads the rank from
``parallel_state`` (``get_pipeline_model_parallel_rank``), whose groups this world never initialises. So Bridge's model
is built with that one value given by megatron-core's own override, ``parallel_state.set_pipeline_model_parallel_rank``
(the rank of the world's pipeline group, 0), for the build only: Bridge's class, fields and code unchanged, no
``parallel_state`` group created (asserted after the build). Ours reads the rank off the collection
(``bridge.providers._StageFromCollectionMixin``). Both are built by ``examples.tiny.build`` as Bridge's ``setup``
builds, the weights copied from Bridge's model into ours (``tiny.copy_weights``, strict: the state-dict keys must be
equal).

Kernels, parametrized. ``torch``: ``deterministic_mode=true``, where megatron-core's ``GatedDeltaNet`` runs torch's
conv1d and ``torch_chunk_gated_delta_rule`` (FLA only for the L2 norm). That rule asserts ``cu_seqlens is None``, so
every micro-batch here is padded rows (BSHD, no packed-sequence parameters). With TE's deterministic attention
(``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0``) the comparison is ``torch.equal``, loss and gradients. ``fla``: the default,
FLA's Triton kernels (``FLA_FLASH_QLA=0``: the Triton path, not the ``flash_qla`` backend), what a run trains with;
megatron-core says FLA is not deterministic, so the gradients are held to the eager floor, Bridge's model against
itself on the same micro-batch (``testing.parity.within_floor``: bit for bit where the floor is, the loss too).

The shape is the unit tests' (``tests/unit/_qwen35.py``, :func:`tiny_qwen35`): 8 decoder layers, three
gated-delta-net layers to one gated standard attention layer, a 2-layer encoder of Qwen3.5's HF class. MoE: Bridge's
default ``global_aux_loss`` sums token counts over the forwards until ``finalize_model_grads`` resets them at the end
of a step; each forward and backward here starts from that reset (megatron-core's ``reset_model_temporary_tensors``),
as each training step does, so a model's gradients never depend on how many forwards it ran before.

FLA 0.5.2 refuses its gated chunk backward on Hopper with Triton >= 3.4.0 and < 3.7.1 unless TileLang takes it
(its issue 640), and ``train`` refuses such a run before its first step
(``host.compat.machine_linear_attention_backward_refusal``). There the ``fla`` cases check that FLA raises as the
probe says, on Bridge's model, and skip with the probe's reason.

Skipped without flash-linear-attention (``fla``): megatron-core's ``GatedDeltaNet`` cannot be built without it. Best
run in its own pytest process, with the variables set for the whole process:

    NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 FLA_FLASH_QLA=0 python -m pytest tests/gpu/test_qwen35_vl_reference.py -q -rA
"""

from __future__ import annotations

import contextlib

import pytest

from bridge_cudagraph.examples.data import IMAGE_MIXES
from bridge_cudagraph.host.compat import linear_attention_kernels_available

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not linear_attention_kernels_available(),
        reason="needs flash-linear-attention (`fla` 0.5.x): megatron-core's GatedDeltaNet cannot be built without it",
    ),
]

SEQ, MBS = 256, 2
BUDGETS = [256, 512, 1024]
MAX_SEGMENTS = 8
MAX_PATCHES_PER_IMAGE = 12 * 12
#: 8 decoder layers at ``linear_attention_freq=4``: gated-delta-net layers 0-2 and 4-6, attention at 3 and 7.
GATED_DELTA_NET_LAYERS = 6
MOE = pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
KERNELS = pytest.mark.parametrize("kernels", ["torch", "fla"])


@pytest.fixture(autouse=True)
def _kernel_settings(monkeypatch):
    """Every model of this module is built with TE's deterministic attention, and FLA's gated delta rule dispatches to
    its Triton kernels (read at each call), not to the ``flash_qla`` backend."""
    monkeypatch.setenv("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0")
    monkeypatch.setenv("FLA_FLASH_QLA", "0")


def tiny_qwen35(moe: bool = False, **overrides):
    """The unit tests' shape (``tests/unit/_qwen35.py``: the tiny Qwen3-VL recipe's sequence, vocabulary and token
    ids, which :func:`~bridge_cudagraph.examples.data.qwen3_vl_batch` writes) with what a GPU build needs on top:
    SwiGLU (Qwen3.5's SiLU; megatron-core's ``GatedDeltaNet`` asserts it on FLA's path), no APEX weight-gradient
    fusion (megatron-core's output layer needs APEX for it) and TE's graph-safe RNG tracker (the world seeds it)."""
    import torch
    from _qwen35 import tiny_qwen35 as unit_shape

    gpu = dict(activation_func=torch.nn.functional.silu, gradient_accumulation_fusion=False, use_te_rng_tracker=True)
    provider = unit_shape(moe, **{**gpu, **overrides})
    assert provider.seq_length == SEQ, provider.seq_length
    return provider


def _vision_block(enabled: bool) -> dict:
    """The ``vision`` part of the block. The largest image here is 12 x 12 = 144 patches: the static attention
    ``max_seqlen``, so TE's deterministic fused attention stays within its workspace (as test_bridge_reference)."""
    return {
        "enabled": enabled,
        "token_budgets": list(BUDGETS),
        "max_images_per_microbatch": MAX_SEGMENTS,
        "max_patches_per_image": MAX_PATCHES_PER_IMAGE,
    }


def _ours(moe: bool, kernels: str, *, vision: bool):
    """Our provider of the shape: language graphs off (refused for gated-delta-net layers), vision as asked."""
    from bridge_cudagraph.bridge.providers import with_cuda_graphs

    host = tiny_qwen35(moe, deterministic_mode=kernels == "torch")
    return with_cuda_graphs(host, language={"enabled": False}, vision=_vision_block(vision))


@contextlib.contextmanager
def _pipeline_rank_for_bridge(world):
    """What Bridge's ``provide()`` needs to build the hybrid block spec in this world: the pipeline rank megatron-core
    reads from ``parallel_state``, given by its own override for the duration, then taken back."""
    from megatron.core import parallel_state

    from bridge_cudagraph.testing.world import parallel_state_untouched

    parallel_state.set_pipeline_model_parallel_rank(world.language.pp.rank())
    try:
        yield
    finally:
        parallel_state.set_pipeline_model_parallel_rank(None)
    assert parallel_state_untouched()


def _bridge_model(world, moe: bool, kernels: str):
    """Bridge's unmodified provider class with our provider's fields (``tiny.upstream_provider``), graphs off
    (``cuda_graph_impl="none"``), built under the language collection, its encoder too."""
    from megatron.bridge.models.qwen_vl.qwen35_vl_provider import Qwen35VLModelProvider, Qwen35VLMoEModelProvider

    from bridge_cudagraph.examples import tiny

    plain = tiny.upstream_provider(_ours(moe, kernels, vision=False))
    plain.cuda_graph_impl = "none"
    assert type(plain) is (Qwen35VLMoEModelProvider if moe else Qwen35VLModelProvider), type(plain)
    assert not hasattr(plain, "cuda_graph")
    with _pipeline_rank_for_bridge(world):
        return tiny.build(plain, world.language)


def _plugin_model(world, moe: bool, kernels: str, bridge, *, vision: bool):
    """Our provider's model, the encoder under the vision collection, holding exactly Bridge's model's weights."""
    from bridge_cudagraph.examples import tiny
    from bridge_cudagraph.testing.world import parallel_state_untouched

    provider = _ours(moe, kernels, vision=vision)
    model = tiny.build(provider, world.language, vision_pg_collection=world.vision)
    assert parallel_state_untouched()
    assert sorted(model[0].state_dict()) == sorted(bridge[0].state_dict())
    tiny.copy_weights(bridge, model)
    return provider, model


def _require_kernels(model, kernels: str) -> None:
    """Every TE attention module built deterministic, and every gated-delta-net layer on the rule ``kernels`` names."""
    from megatron.core.ssm.gated_delta_net.common import chunk_gated_delta_rule, torch_chunk_gated_delta_rule
    from megatron.core.ssm.gated_delta_net.gdn import GatedDeltaNet
    from transformer_engine.pytorch import DotProductAttention

    attention = [m for m in model[0].modules() if isinstance(m, DotProductAttention)]
    assert attention and all(m.deterministic for m in attention), [m.deterministic for m in attention]
    rule = torch_chunk_gated_delta_rule if kernels == "torch" else chunk_gated_delta_rule
    layers = [m for m in model[0].modules() if isinstance(m, GatedDeltaNet)]
    assert len(layers) == GATED_DELTA_NET_LAYERS, len(layers)
    assert all(m.gated_delta_rule is rule for m in layers), {m.gated_delta_rule.__name__ for m in layers}


def _batches(*, images_only: bool = False) -> dict:
    from bridge_cudagraph.examples.data import qwen3_vl_batch

    sets = {k: v for k, v in IMAGE_MIXES.items() if not (images_only and k == "no_image")}
    return {name: qwen3_vl_batch(images, SEQ, seed=7) for name, images in sets.items()}


def _step(model, batch):
    """One forward and backward from a step's start: zeroed gradients (``loss_and_grads``) after megatron-core's
    end-of-step reset of the MoE routers' token counts."""
    from megatron.core.distributed.finalize_model_grads import reset_model_temporary_tensors
    from megatron.core.utils import get_model_config

    from bridge_cudagraph.testing.parity import loss_and_grads

    reset_model_temporary_tensors(get_model_config(model[0]), model)
    return loss_and_grads(model, batch)


def _require_bridges_numbers(plugin, bridge, batches: dict, kernels: str, what: str, record) -> None:
    """Each of ``batches`` on ``plugin`` as on ``bridge``: bit for bit under ``torch`` kernels; under ``fla``, within
    Bridge's own floor on the same micro-batch (bit for bit where Bridge reproduces itself)."""
    from bridge_cudagraph.testing.parity import diff, within_floor

    for name, batch in batches.items():
        ours, theirs = _step(plugin, batch), _step(bridge, batch)
        assert sorted(ours[1]) == sorted(theirs[1]), sorted(set(ours[1]) ^ set(theirs[1]))[:10]
        d = diff(ours, theirs, worst=3)
        where = f"{what}/{name} vs Bridge's unmodified model"
        if kernels == "torch":
            record(case=what, batch=name, parameters=len(theirs[1]), **d.as_dict())
            d.require_exact(where)
            continue
        floor = diff(_step(bridge, batch), theirs)
        record(case=what, batch=name, parameters=len(theirs[1]), floor=floor.as_dict(), **d.as_dict())
        assert within_floor(d, floor), f"{where}: {d}, Bridge against itself: {floor}"


def _fla_backward_refusal(kernels: str) -> str | None:
    """Why FLA refuses the gated-delta-net backward on this machine (Hopper with Triton >= 3.4.0 and < 3.7.1,
    without TileLang), as ``train`` refuses such a run before its first step; None under ``torch`` kernels."""
    from bridge_cudagraph.host.compat import machine_linear_attention_backward_refusal

    return machine_linear_attention_backward_refusal() if kernels == "fla" else None


@MOE
@KERNELS
def test_graphs_off_matches_bridge(world, record, moe, kernels):
    bridge = _bridge_model(world, moe, kernels)
    _require_kernels(bridge, kernels)
    if refusal := _fla_backward_refusal(kernels):
        # The probe behind train's refusal must agree with FLA itself: Bridge's model fails at its first backward.
        with pytest.raises(RuntimeError, match=r"< 3\.7\.1 on Hopper"):
            _step(bridge, _batches()["no_image"])
        pytest.skip(f"FLA refuses the backward here, as train does before its first step: {refusal}")
    _, plugin = _plugin_model(world, moe, kernels, bridge, vision=False)
    _require_kernels(plugin, kernels)
    _require_bridges_numbers(plugin, bridge, _batches(), kernels, f"qwen35_vl {moe=} {kernels} graphs off", record)


@contextlib.contextmanager
def _forward(plugin, forward: str):
    """``ours``: :mod:`bridge_cudagraph.host.forward` installed on the plugin's model for the body, which must take
    every micro-batch's positions from the host copy and merge its image rows by position; ``bridge``: Bridge's."""
    from bridge_cudagraph.host import forward as forward_host

    if forward == "bridge":
        yield lambda batches: None
        return
    done = forward_host.install(plugin)
    assert {mixin.__name__ for _, mixin in done.pairs} >= {"CpuRopeIndex", "RowMerge"}, done.pairs

    def require_counts(batches: dict) -> None:
        counts = forward_host.counts(done)
        assert counts["cpu_positions_calls"] == counts["row_merges"] == len(batches), counts
        assert counts["flat_batches"] == 0, counts  # padded rows: nothing to pack

    try:
        yield require_counts
    finally:
        forward_host.uninstall(done)
    assert not forward_host.installed(plugin)


@MOE
@KERNELS
@pytest.mark.parametrize("forward", ["bridge", "ours"], ids=["bridge_forward", "our_forward"])
def test_vision_graphs_match_bridge(world, record, moe, kernels, forward):
    from bridge_cudagraph.testing.parity import assert_captured
    from bridge_cudagraph.testing.plans import plan_for

    if refusal := _fla_backward_refusal(kernels):
        pytest.skip(f"FLA refuses the backward here (test_graphs_off_matches_bridge checks FLA agrees): {refusal}")
    bridge = _bridge_model(world, moe, kernels)
    provider, plugin = _plugin_model(world, moe, kernels, bridge, vision=True)
    _require_kernels(bridge, kernels)
    _require_kernels(plugin, kernels)
    plan = plan_for(provider, world_size=1, micro_batch_size=MBS, num_microbatches=1)
    assert not plan.language.enabled and plan.vision is not None and plan.vision.enabled
    # No deepstack layer cuts Qwen3.5's encoder: one graph per budget, spanning both layers, one copy.
    assert plan.vision.graphs == len(plan.vision.token_budgets) == len(BUDGETS), plan.vision
    (helper,) = provider.make_graph_helpers(plugin, plan=plan)  # the vision helper alone: no language graphs
    assert helper.submodule == "vision"
    helper.create_cudagraphs()
    try:
        record(case="vision capture", moe=moe, kernels=kernels, failed=helper.stats.failed, graphs=helper.stats.graphs)
        assert helper.stats.failed is None, f"vision capture fell back to eager: {helper.stats.failed}"
        assert helper.graphs_created() and helper.stats.graphs == plan.vision.graphs, helper.stats
        batches = _batches(images_only=True)
        with _forward(plugin, forward) as require_counts:
            what = f"qwen35_vl {moe=} {kernels} vision graphs, {forward} forward"
            _require_bridges_numbers(plugin, bridge, batches, kernels, what, record)
            require_counts(batches)
        assert helper.stats.replays == len(batches) and helper.stats.eager_fallbacks == 0, helper.stats
        assert_captured(helper.stats)
    finally:
        helper.delete_cuda_graphs()
