"""The reference is Bridge's own model: the plugin, graphs off and graphs on, matches Bridge's UNMODIFIED provider
bit for bit, under TE's deterministic kernels.

Every other parity test compares the plugin against the plugin (its own provider with graphs off, its own rebuilt
vision encoder). Here the reference is megatron.bridge's ``GPTModelProvider`` / ``Qwen3VLModelProvider`` itself
(``examples.tiny.upstream_provider`` with ``cuda_graph_impl="none"``: no ``cuda_graph`` block, no mixin, Bridge's own
vision encoder built under the language collection), with the weights copied into it from the plugin's model
(``tiny.copy_weights``, strict: the state-dict keys must be identical).

Four cases, per-token loss and every parameter gradient compared with ``torch.equal``:

(a) the plugin's provider, graphs off;
(b) the plugin with language graphs on, after capture, replaying (replays counted);
(c) Qwen3-VL with vision graphs on, replaying; a capture that falls back to eager fails the test (the plan caps
    the attention ``max_seqlen`` at the largest image, so TE's deterministic kernels fit their workspace);
(d) language graphs on with ``gradient_accumulation_fusion=true`` (TE's layers fuse without APEX), against Bridge's
    model with TE's fusion on in the same modules.

Parameter names: the plugin rebuilds Qwen3-VL's vision encoder under its own groups
(``host.encoder_swap.rebuild_vision_encoder``) with the same module tree, so its state-dict keys and parameter names
are Bridge's (``test_vision_capture.test_upstream_vision_graph_path_changes_the_numbers`` loads one into the other
with ``strict=True``). No mapping is applied: the test asserts the name sets are equal and compares every gradient by
name, language and vision alike; a renamed parameter fails here with the names that differ.

Determinism: without ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0`` Bridge's own backward is not deterministic (layer-norm
weight gradients differ by up to 7e-3 relative between two identical eager runs on the H200). TE 2.20 reads the
variable when each ``DotProductAttention`` is built (``dot_product_attention.py:950``) and stores it as
``.deterministic``, so an autouse fixture sets it (``monkeypatch``: only while this module's tests build their
models, so the other GPU tests of a session keep their own setting) and every built attention module is checked
to hold ``deterministic=True``: a TE that read it elsewhere would fail that check, not pass unnoticed. Best run in
its own pytest process, with the variable set for the whole process:

    NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 python -m pytest tests/gpu/test_bridge_reference.py -q -rA
"""

from __future__ import annotations

import contextlib

import pytest

from bridge_cudagraph.examples.data import IMAGE_MIXES

pytestmark = pytest.mark.gpu

SEQ, MBS = 256, 2
BUDGETS = [256, 512, 1024]
MAX_SEGMENTS = 8
MAX_PATCHES_PER_IMAGE = 12 * 12


@pytest.fixture(autouse=True)
def _deterministic(monkeypatch):
    """Every model of this module is built with TE's deterministic kernels."""
    monkeypatch.setenv("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0")


def _require_deterministic(model) -> int:
    """Every TE attention module of ``model`` was built deterministic; returns how many there are."""
    from transformer_engine.pytorch import DotProductAttention

    modules = [m for m in model[0].modules() if isinstance(m, DotProductAttention)]
    assert modules, "no TE DotProductAttention in the model"
    loose = [type(m).__name__ for m in modules if not m.deterministic]
    assert not loose, f"{len(loose)} of {len(modules)} attention modules were built non-deterministic"
    return len(modules)


def _cfg(language: bool, vision: bool):
    """The block of these tests."""
    from bridge_cudagraph.config import CudaGraphConfig, LanguageGraphConfig, VisionGraphConfig

    return CudaGraphConfig(
        language=LanguageGraphConfig(enabled=language),
        # The largest image here is 12 x 12 = 144 patches: the static attention max_seqlen, so TE's deterministic
        # fused attention stays within its workspace limit (with the budget as max_seqlen it falls back to eager).
        vision=VisionGraphConfig(
            enabled=vision,
            token_budgets=list(BUDGETS),
            max_images_per_microbatch=MAX_SEGMENTS,
            max_patches_per_image=MAX_PATCHES_PER_IMAGE,
        ),
    )


def _make(kind: str, cfg=None, **fields):
    from bridge_cudagraph.examples import tiny

    return tiny.tiny_gpt_provider(cfg, **fields) if kind == "gpt" else tiny.tiny_qwen3_vl_provider(cfg, **fields)


def _bridge_model(kind: str, world, *, fused: bool = False, **fields):
    """The same model on Bridge's own provider class, graphs off (``cuda_graph_impl="none"``), with provider
    ``fields``; ``fused``: with TE's weight-gradient fusion on in the modules built from its config (what its
    ``gradient_accumulation_fusion=true`` gives them where APEX lets the host build it)."""
    from bridge_cudagraph.examples import tiny
    from bridge_cudagraph.host.wgrad_fusion import fuse_te_modules

    plain = tiny.upstream_provider(_make(kind, **fields))
    plain.cuda_graph_impl = "none"
    assert not hasattr(plain, "cuda_graph"), type(plain)
    assert type(plain).__module__.startswith("megatron.bridge"), type(plain)
    model = tiny.build(plain, world.language)
    if fused:
        fuse_te_modules(model[0], plain)
    return model


def _plugin_model(kind: str, world, cfg, bridge, **fields):
    """The plugin's model under ``cfg`` (and provider ``fields``) holding exactly Bridge's model's weights."""
    from bridge_cudagraph.examples import tiny

    provider = _make(kind, cfg, **fields)
    model = tiny.build(provider, world.language, vision_pg_collection=world.vision)
    assert sorted(model[0].state_dict()) == sorted(bridge[0].state_dict())
    tiny.copy_weights(bridge, model)
    return provider, model


def _batches(kind: str):
    from bridge_cudagraph.examples.data import gpt_batch, qwen3_vl_batch

    if kind == "gpt":
        return {f"text_{s}": gpt_batch(MBS, SEQ, seed=s) for s in range(3)}
    return {name: qwen3_vl_batch(images, SEQ, seed=7) for name, images in IMAGE_MIXES.items()}


def _require_bit_identical(plugin, bridge, batches, what: str, record, *, census_first: bool = False) -> dict | None:
    """Each of ``batches`` on ``plugin`` bit for bit on ``bridge``; with ``census_first``, the plugin's run of the
    first batch under the host-wait census (:func:`benchmarks.host_syncs.census`), which is returned (else None)."""
    from benchmarks.host_syncs import census
    from bridge_cudagraph.testing.parity import diff, loss_and_grads

    waits = None
    for name, batch in batches.items():
        if census_first and waits is None:
            got: list = []
            waits = census(lambda batch=batch, got=got: got.append(loss_and_grads(plugin, batch)))
            ours = got[0]
        else:
            ours = loss_and_grads(plugin, batch)
        theirs = loss_and_grads(bridge, batch)
        assert sorted(ours[1]) == sorted(theirs[1]), sorted(set(ours[1]) ^ set(theirs[1]))[:10]
        d = diff(ours, theirs)
        record(case=what, batch=name, parameters=len(theirs[1]), **d.as_dict())
        d.require_exact(f"{what}/{name} vs Bridge's unmodified model")
    return waits


@pytest.mark.parametrize("kind", ["gpt", "qwen3_vl"])
def test_graphs_off_matches_bridge_bit_for_bit(world, record, kind):
    bridge = _bridge_model(kind, world)
    _, plugin = _plugin_model(kind, world, None, bridge)
    record(case="graphs_off", kind=kind, attention_modules=_require_deterministic(bridge))
    _require_deterministic(plugin)
    _require_bit_identical(plugin, bridge, _batches(kind), f"{kind} graphs off", record)


@pytest.mark.parametrize("kind", ["gpt", "qwen3_vl"])
def test_language_graphs_match_bridge_bit_for_bit(world, record, kind):
    from bridge_cudagraph.testing.parity import assert_captured

    bridge = _bridge_model(kind, world)
    provider, plugin = _plugin_model(kind, world, _cfg(True, False), bridge)
    _require_deterministic(bridge)
    _require_deterministic(plugin)
    batches = _batches(kind)
    from bridge_cudagraph.testing.plans import plan_for

    plan = plan_for(provider, world_size=1, micro_batch_size=MBS, num_microbatches=1)
    helper = provider.make_language_graph_helper(plugin, plan=plan)
    helper.create_cudagraphs()
    try:
        assert helper.graphs_created(), helper.stats.failed
        # The product's unit: runs of layers (GPT's 4 layers one graph, Qwen3-VL's 0, 1 and 2-3).
        assert plan.language.graph_unit == "run"
        assert helper.stats.graphs == len(plan.language.segments_per_stage[0]) < helper.stats.layers
        _require_bit_identical(plugin, bridge, batches, f"{kind} language graphs", record)
        assert helper.stats.replays == len(batches), helper.stats
        assert_captured(helper.stats)
    finally:
        helper.delete_cuda_graphs()


@pytest.mark.parametrize("kind", ["gpt", "qwen3_vl"])
def test_fused_weight_gradients_match_bridge_bit_for_bit(world, record, kind):
    """``gradient_accumulation_fusion=true`` without APEX (:mod:`bridge_cudagraph.host.wgrad_fusion`), language graphs
    on, against Bridge's unmodified provider with TE's fusion on in the same modules: what Bridge's own config gives
    its TE layers where APEX lets it build (it cannot here: megatron-core's output layer needs APEX). Every gradient is
    read from ``main_grad``, where the fused GEMMs wrote it; the fused modules are counted and must be marked as added.
    """
    from bridge_cudagraph.host.wgrad_fusion import te_modules_fusing
    from bridge_cudagraph.testing.parity import assert_captured
    from bridge_cudagraph.testing.plans import plan_for

    bridge = _bridge_model(kind, world, fused=True)
    fused_in_bridge = te_modules_fusing(bridge[0])
    provider, plugin = _plugin_model(kind, world, _cfg(True, False), bridge, gradient_accumulation_fusion=True)
    assert provider.gradient_accumulation_fusion is True  # the recipe's value, kept through the unfused build
    assert te_modules_fusing(plugin[0]) == fused_in_bridge > 0, (te_modules_fusing(plugin[0]), fused_in_bridge)
    _require_deterministic(bridge)
    _require_deterministic(plugin)
    plan = plan_for(provider, world_size=1, micro_batch_size=MBS, num_microbatches=1)
    helper = provider.make_language_graph_helper(plugin, plan=plan)
    helper.create_cudagraphs()
    try:
        assert helper.graphs_created(), helper.stats.failed
        batches = _batches(kind)
        _require_bit_identical(plugin, bridge, batches, f"{kind} fused language graphs", record)
        fused_weights = {id(m.weight) for m in plugin[0].modules() if getattr(m, "fuse_wgrad_accumulation", False)}
        marked = [p for p in plugin[0].parameters() if id(p) in fused_weights and p.grad_added_to_main_grad]
        record(case="fused", kind=kind, te_modules_fusing=fused_in_bridge, marked=len(marked))
        assert len(marked) == len(fused_weights), (len(marked), len(fused_weights))
        assert helper.stats.replays == len(batches), helper.stats
        assert_captured(helper.stats)
    finally:
        helper.delete_cuda_graphs()


@contextlib.contextmanager
def _replaying_vision_graphs(
    provider, plugin, plan, record, case: str, batches: dict | None = None, *, replays_per_batch: int = 1, out=None
):
    """The plugin's vision helper under ``plan``, captured; yields the image batches (each replays a budget): this
    module's, or ``batches`` (the helper into ``out["helper"]`` where ``out`` is given). A capture that fell back to
    eager fails with its own cause. After the body: every batch replayed ``replays_per_batch`` times, none ran eagerly,
    the capture counted; the graphs are deleted."""
    from bridge_cudagraph.testing.parity import assert_captured

    (helper,) = (h for h in provider.make_graph_helpers(plugin, plan=plan) if h.submodule == "vision")
    helper.create_cudagraphs()
    if out is not None:
        out["helper"] = helper
    try:
        record(case=case, capture_failed=helper.stats.failed, graphs=helper.stats.graphs)
        assert helper.stats.failed is None, f"vision capture fell back to eager: {helper.stats.failed}"
        assert helper.graphs_created() and helper.stats.graphs > 0
        if batches is None:
            batches = {k: v for k, v in _batches("qwen3_vl").items() if k != "no_image"}
        yield batches
        replays = replays_per_batch * len(batches)
        assert helper.stats.replays == replays and helper.stats.eager_fallbacks == 0, helper.stats
        assert_captured(helper.stats)
    finally:
        helper.delete_cuda_graphs()


def test_vision_graphs_match_bridge_bit_for_bit(world, record):
    from bridge_cudagraph.testing.plans import plan_for

    bridge = _bridge_model("qwen3_vl", world)
    provider, plugin = _plugin_model("qwen3_vl", world, _cfg(False, True), bridge)
    _require_deterministic(bridge)
    _require_deterministic(plugin)
    plan = plan_for(provider, world_size=1, micro_batch_size=MBS, num_microbatches=1)
    with _replaying_vision_graphs(provider, plugin, plan, record, "vision graphs") as batches:
        _require_bit_identical(plugin, bridge, batches, "qwen3_vl vision graphs", record)


#: Budgets up to 4096 patches with the image size the plan derives: under deterministic kernels the plan lowers the
#: static ``max_seqlen`` below TE's unfused threshold and counts cuDNN's workspace, 16 GiB at the top rung
#: (:mod:`bridge_cudagraph.plan.determinism`); the module's other cases stop at 1024 patches of 144-patch images.
LARGE_BUDGETS = [1024, 2048, 4096]
LARGE_SEQ = 2048


def test_vision_graphs_at_4096_patches_match_bridge(world, record):
    """Every rung of a ladder up to 4096 patches captured under deterministic kernels at the derived image size
    (none falls back to eager for its workspace or backend), a micro-batch replayed on each rung. The graphs replay
    the same layers run eagerly on the same padded static inputs bit for bit (loss and every gradient); against
    Bridge's unmodified model the per-token loss is exact and the gradients part from it no further than that padded
    eager computation does: a rung's padding rows are zeros, but a weight gradient sums over the rows and more rows
    change how the GEMM and the deterministic attention kernel block that sum, which is the padding's own effect,
    not the graphs' (``tests/gpu/test_vision_padding.py`` records it at the photo data's shapes)."""
    import math

    import torch

    from bridge_cudagraph.config import CudaGraphConfig, LanguageGraphConfig, VisionGraphConfig
    from bridge_cudagraph.examples.data import qwen3_vl_batch
    from bridge_cudagraph.testing.parity import diff, grads_differ, loss_and_grads
    from bridge_cudagraph.testing.plans import plan_for
    from tests.gpu._padded_eager import padded_eager_loss_and_grads

    cfg = CudaGraphConfig(
        language=LanguageGraphConfig(enabled=False),
        vision=VisionGraphConfig(enabled=True, token_budgets=list(LARGE_BUDGETS)),
    )
    bridge = _bridge_model("qwen3_vl", world, seq_length=LARGE_SEQ)
    provider, plugin = _plugin_model("qwen3_vl", world, cfg, bridge, seq_length=LARGE_SEQ)
    _require_deterministic(bridge)
    _require_deterministic(plugin)
    plan = plan_for(provider, world_size=1, micro_batch_size=MBS, num_microbatches=1)
    assert plan.vision.token_budgets == tuple(LARGE_BUDGETS), plan.vision.token_budgets
    # The largest square image (even sides, for the 2x2 merge) that the plan replays and that leaves the smallest
    # rung padded, so that every rung below holds one micro-batch with padding.
    side = math.isqrt(min(plan.vision.max_patches_per_image, LARGE_BUDGETS[0]) - 1) // 2 * 2
    per_image = side * side
    batches, rungs = {}, {}
    for below, budget in zip([0, *LARGE_BUDGETS], LARGE_BUDGETS, strict=False):
        n = budget // per_image
        assert below < n * per_image <= budget, (budget, per_image)  # the micro-batch lands on this rung
        images = [(1, side, side)] * n
        name = f"{n}x{side}x{side}"
        batches[name] = qwen3_vl_batch([images[: (n + 1) // 2], images[(n + 1) // 2 :]], LARGE_SEQ, seed=n)
        rungs[name] = budget
    case = "vision graphs at 4096 patches"
    record(case=case, max_patches_per_image=plan.vision.max_patches_per_image, side=side)
    out: dict = {}
    with _replaying_vision_graphs(provider, plugin, plan, record, case, batches, replays_per_batch=2, out=out) as got:
        for name, batch in got.items():
            graphs = loss_and_grads(plugin, batch)
            padded = padded_eager_loss_and_grads(plugin, out["helper"], rungs[name], batch)
            unpadded = loss_and_grads(bridge, batch)
            what = f"qwen3_vl vision graphs at 4096 patches/{name}"
            assert torch.equal(graphs[0], padded[0]), f"{what}: graphs vs padded eager: per-token loss differs"
            differing = grads_differ(graphs[1], padded[1])
            assert not differing, f"{what}: graphs vs padded eager: {len(differing)} gradients differ: {differing[:3]}"
            d, padding = diff(graphs, unpadded), diff(padded, unpadded)
            record(case=case, batch=name, padded_eager_grad_max_rel_l2=padding.grad_max_rel_l2, **d.as_dict())
            assert d.loss_exact and not d.grad_missing, f"{what} vs Bridge's unmodified model: {d}"
            assert d.grad_max_rel_l2 <= padding.grad_max_rel_l2, f"{what}: beyond the padding's own effect: {d}"


def test_vision_graphs_read_the_collates_cpu_grid_bit_for_bit(world, record):
    """With ``forward.collated_grids`` on, a replaying encoder reads the grid the step's micro-batch holds on the CPU
    (:mod:`bridge_cudagraph.vision.cpu_grids`) instead of reading it back: per-token loss and every gradient bit for
    bit Bridge's unmodified model's; every forward bound its grid and no replay read one back. Captured again, the
    same batches without a CPU grid, or with one of another shape (not bound), read it back, as exactly; a forward
    and backward with the CPU grid makes the encoder's replay wait for the GPU nowhere, one reading it back once (the
    census of each, by site, recorded)."""
    from bridge_cudagraph.host import forward as forward_host
    from bridge_cudagraph.micro_batch import CpuGrids
    from bridge_cudagraph.testing.plans import plan_for
    from bridge_cudagraph.testing.step_batch import CPU_GRIDS
    from bridge_cudagraph.vision.encoder import GraphedQwen3VLVisionModel

    bridge = _bridge_model("qwen3_vl", world)
    provider, plugin = _plugin_model("qwen3_vl", world, _cfg(False, True), bridge)
    _require_deterministic(bridge)
    _require_deterministic(plugin)
    (encoder,) = (m for m in plugin[0].modules() if isinstance(m, GraphedQwen3VLVisionModel))
    plan = plan_for(provider, world_size=1, micro_batch_size=MBS, num_microbatches=1)
    done = forward_host.install(plugin)
    waits = {}
    try:
        with _replaying_vision_graphs(provider, plugin, plan, record, "vision graphs, CPU grid") as batches:
            cpu = {name: CpuGrids({"image_grid_thw": b["image_grid_thw"].cpu()}) for name, b in batches.items()}
            with_cpu = {name: {**batch, CPU_GRIDS: cpu[name]} for name, batch in batches.items()}
            waits["cpu grid"] = _require_bit_identical(
                plugin, bridge, with_cpu, "vision graphs, CPU grid", record, census_first=True
            )
            binds = forward_host.counts(done)["grid_binds"]
            assert binds == len(batches) and encoder.graph_helper.grids_read_back == 0
        with _replaying_vision_graphs(provider, plugin, plan, record, "vision graphs, grid read back") as batches:
            first = next(iter(batches))
            shorter = CpuGrids({"image_grid_thw": batches[first]["image_grid_thw"].cpu()[:-1]})
            read_back = {**batches, first: {**batches[first], CPU_GRIDS: shorter}}
            waits["read back"] = _require_bit_identical(
                plugin, bridge, read_back, "vision graphs, read back", record, census_first=True
            )
            assert forward_host.counts(done)["grid_binds"] == binds  # no CPU grid, or one of another shape: none bound
            assert encoder.graph_helper.grids_read_back == len(batches)
    finally:
        forward_host.uninstall(done)
    # Where the waits are, not only how many: the totals mix in one-time waits of whatever runs first (run 79: 1 and 1;
    # run 80, this test first in its process: 25 with the CPU grid, 24 of them megatron-core's fused cross entropy).
    # The encoder's replay: the encoder's own lines and its helper's (capture/vision.py, where the grid is read).
    replay = ("bridge_cudagraph/vision/encoder.py", "bridge_cudagraph/capture/vision.py")
    encoder = {case: sum(_waits_in(got, path) for path in replay) for case, got in waits.items()}
    record(
        case="host waits per forward and backward, first batch",
        **{f"{case} total": got["total"] for case, got in waits.items()},
        **{f"{case} in the encoder": n for case, n in encoder.items()},
        sites={case: got["sites"] for case, got in waits.items()},
    )
    assert encoder == {"cpu grid": 0, "read back": 1}, waits


def _waits_in(census: dict, path: str) -> int:
    """The host waits of a :func:`benchmarks.host_syncs.census` asked for by a line of ``path`` itself."""
    return sum(n for site, n in census["sites"] if site.startswith(path + ":"))


def _host_waits(fn) -> int:
    """How many times ``fn`` makes the host wait for the GPU (the benchmark's census: torch's sync debug mode)."""
    from benchmarks.host_syncs import census

    return census(fn)["total"]


@pytest.mark.parametrize("language", [False, True], ids=["graphs_off", "language_graphs"])
def test_the_forward_parts_match_bridge_bit_for_bit(world, record, language):
    """``model.cuda_graph.forward`` (:mod:`bridge_cudagraph.host.forward`: mRoPE positions from one host copy, the
    deepstack and image-token merges by row positions) on the plugin's Qwen3-VL, graphs off and language graphs
    replaying: per-token loss and every gradient bit for bit Bridge's unmodified model's, on every image mix; every
    micro-batch took the host copy, every one with images the row merge; a forward and backward with images waits less
    often than Bridge's (both counted and recorded)."""
    from bridge_cudagraph.host import forward as forward_host
    from bridge_cudagraph.testing.parity import assert_captured, loss_and_grads
    from bridge_cudagraph.testing.plans import plan_for

    bridge = _bridge_model("qwen3_vl", world)
    provider, plugin = _plugin_model("qwen3_vl", world, _cfg(language, False), bridge)
    _require_deterministic(bridge)
    _require_deterministic(plugin)
    helper = None
    if language:
        plan = plan_for(provider, world_size=1, micro_batch_size=MBS, num_microbatches=1)
        assert plan.forward.parts == tuple(forward_host.MECHANISMS)
        helper = provider.make_language_graph_helper(plugin, plan=plan)
        helper.create_cudagraphs()
        assert helper.graphs_created(), helper.stats.failed
    done = forward_host.install(plugin)
    try:
        mixins = {mixin for _, mixin in done.pairs}
        assert mixins == set(forward_host.MIXINS.values()), done
        batches = _batches("qwen3_vl")
        _require_bit_identical(plugin, bridge, batches, f"fewer host waits, language graphs {language}", record)
        counts = forward_host.counts(done)
        assert counts == forward_host.counts_in(plugin) and counts["cpu_positions_calls"] == len(batches)
        with_images = sum(batch["image_grid_thw"] is not None for batch in batches.values())
        assert counts["row_merges"] == with_images > 0, (counts, with_images)
        assert counts["flat_batches"] == 0  # BSHD rows: nothing for Bridge to pack
        for name, batch in batches.items():
            ours = _host_waits(lambda batch=batch: loss_and_grads(plugin, batch))
            theirs = _host_waits(lambda batch=batch: loss_and_grads(bridge, batch))
            record(case="host waits per forward and backward", batch=name, ours=ours, bridge=theirs)
            if batch["image_grid_thw"] is not None:
                assert ours < theirs, (name, ours, theirs)
        if helper is not None:
            assert helper.stats.replays == 2 * len(batches), helper.stats
            assert_captured(helper.stats)
    finally:
        forward_host.uninstall(done)
        if helper is not None:
            helper.delete_cuda_graphs()
    assert not forward_host.installed(plugin)


def test_the_merges_never_wait_and_the_positions_wait_at_most_once(world, record):
    """In isolation, on the GPU: the deepstack merge and the image-token merge by row positions, forward and backward,
    never wait, and give Bridge's output and gradients bit for bit; the pending positions wait at most once (for their
    own host copies) and equal Bridge's ``get_rope_index`` on the GPU's tensors (which waits many times)."""
    import torch
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.rope import get_rope_index
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.transformer_block import Qwen3VLTransformerBlock

    from bridge_cudagraph.host.forward_counts import ForwardCounts
    from bridge_cudagraph.host.rope_index import PendingPositions
    from bridge_cudagraph.host.row_merge import IndexedDeepstack, VisionRows
    from bridge_cudagraph.micro_batch import open_micro_batch

    g = torch.Generator(device="cuda").manual_seed(0)
    mask = torch.rand(MBS, SEQ, generator=g, device="cuda") < 0.3
    hidden = torch.randn(SEQ, MBS, 64, generator=g, device="cuda", dtype=torch.bfloat16)
    embeds = torch.randn(int(mask.sum()), 64, generator=g, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(SEQ, MBS, 64, generator=g, device="cuda", dtype=torch.bfloat16)

    def merge(method):
        h, e = hidden.clone().requires_grad_(True), embeds.clone().requires_grad_(True)
        out = method(None, h, mask, e)
        (out * weight).sum().backward()
        return out.detach(), h.grad, e.grad

    theirs = merge(Qwen3VLTransformerBlock._deepstack_process)
    ours = merge(IndexedDeepstack._deepstack_process)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    waits = {
        "deepstack_bridge": _host_waits(lambda: merge(Qwen3VLTransformerBlock._deepstack_process)),
        "deepstack_ours": _host_waits(lambda: merge(IndexedDeepstack._deepstack_process)),
    }

    def image_merge(counter=None):  # Bridge's statement in its forward (model.py), as test_row_merge's CPU case
        h, e = hidden.clone().requires_grad_(True), embeds.clone().requires_grad_(True)
        rows = e * 1.0
        if counter is not None:
            rows = rows.as_subclass(VisionRows)
            rows.counts = counter
        combined = (h * 1.0).transpose(0, 1).contiguous()
        combined[mask] = rows
        out = combined.transpose(0, 1).contiguous()
        (out * weight).sum().backward()
        return out.detach(), h.grad, e.grad

    counter = ForwardCounts()
    assert all(torch.equal(a, b) for a, b in zip(image_merge(counter), image_merge(), strict=True))
    waits["image_merge_bridge"] = _host_waits(image_merge)
    waits["image_merge_ours"] = _host_waits(lambda: image_merge(counter))
    assert counter.row_merges == 2
    model = _bridge_model("qwen3_vl", world)[0].module
    while not hasattr(model, "image_token_id"):
        model = model.module
    batch = _batches("qwen3_vl")["several_sizes"]
    args = (model.config.spatial_merge_size, model.image_token_id, model.video_token_id, model.vision_start_token_id)
    theirs = get_rope_index(*args, batch["input_ids"], image_grid_thw=batch["image_grid_thw"])[0]

    def ours_positions():
        with open_micro_batch() as micro_batch:
            pending = PendingPositions(model, batch, micro_batch)
            pending.fill()
            return pending.positions

    assert torch.equal(ours_positions(), theirs)
    waits["positions_bridge"] = _host_waits(
        lambda: get_rope_index(*args, batch["input_ids"], image_grid_thw=batch["image_grid_thw"])
    )
    waits["positions_ours"] = _host_waits(ours_positions)
    record(case="host waits in isolation", **waits)
    assert waits["deepstack_ours"] == 0 < waits["deepstack_bridge"], waits
    assert waits["image_merge_ours"] == 0 < waits["image_merge_bridge"], waits
    assert waits["positions_ours"] <= 1 < waits["positions_bridge"], waits
