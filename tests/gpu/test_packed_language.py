"""Packed (THD) language graphs vs eager, on micro-batches packed the way Bridge's Qwen3-VL step packs them.

Run in its own process so deterministic kernels can be asked for before Transformer Engine is imported:

    NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 python -m pytest tests/gpu/test_packed_language.py

With that setting every comparison asserts bit-exactness (per-token loss and every gradient, ``torch.equal``);
without it, Bridge's own backward is not deterministic and the test asserts the eager-vs-eager floor measured in
the same run instead. References: the plugin's model with graphs off, and Bridge's unmodified provider.
"""

from __future__ import annotations

import math
import os

import pytest

pytestmark = pytest.mark.gpu

DETERMINISTIC = os.environ.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO") == "0"
SEQ = 512
MBS = 2
BUDGETS = (1024,)

# (real tokens per row, images per row): packed width 2 x ceil(max/16)*16 -> 30%, 70% and 100% of the budget.
CASES = {
    "fill_30": [(150, [(1, 8, 8)]), (96, [])],
    "fill_70": [(352, [(1, 8, 12), (1, 4, 4)]), (200, [(1, 16, 8)])],
    "fill_100": [(512, [(1, 12, 12)]), (480, [(1, 8, 8)])],
}
# Three rows: more sequences than the graphs hold (max_sequences = micro-batch size): runs eagerly, counted.
FALLBACK = [(128, [(1, 8, 8)]), (64, []), (100, [(1, 4, 4)])]


def _packed_batch(rows, *, seed: int, pg_collection, seq: int = SEQ) -> dict:
    """One micro-batch as Bridge's collate + ``qwen3_vl_step`` (``enable_in_batch_packing``) hand it to the model.

    Rows of different real lengths are padded to the longest (pad 0, label -100, loss mask 0), as the collate
    pads them; :func:`bridge_cudagraph.testing.step_batch.qwen3_vl_step_inputs` then runs the step's own
    ``_pad_and_pack_qwen3_vl_step`` and its packing branch.
    """
    import torch
    from megatron.bridge.training.utils.visual_inputs import GenericVisualInputs

    from bridge_cudagraph.examples.data import qwen3_vl_batch
    from bridge_cudagraph.testing.step_batch import qwen3_vl_step_inputs

    samples = [qwen3_vl_batch([images], length, seed=seed + i) for i, (length, images) in enumerate(rows)]
    width = max(length for length, _ in rows)

    def pad(t, value):
        return torch.nn.functional.pad(t, (0, width - t.size(1)), value=value)

    pixels = [s["pixel_values"] for s in samples if s["pixel_values"] is not None]
    grids = [s["image_grid_thw"] for s in samples if s["image_grid_thw"] is not None]
    tokens = torch.cat([pad(s["input_ids"], 0) for s in samples])
    collated = {
        "input_ids": tokens,
        "labels": torch.cat([pad(s["labels"], -100) for s in samples]),
        "loss_mask": torch.cat([pad(s["loss_mask"], 0.0) for s in samples]),
        "position_ids": torch.arange(width, device=tokens.device).expand(len(rows), -1).contiguous(),
        "visual_inputs": GenericVisualInputs(
            pixel_values=torch.cat(pixels) if pixels else None, image_grid_thw=torch.cat(grids) if grids else None
        ),
    }
    return qwen3_vl_step_inputs(collated, pg_collection, packed=True, seq_length=seq)


def _models(world, seq: int = SEQ, fused: bool = False):
    """The graphed plugin model, the plugin's graphs-off twin and Bridge's unmodified model, with the same weights;
    ``fused``: ``gradient_accumulation_fusion=true`` (:mod:`bridge_cudagraph.host.wgrad_fusion`) on the plugin's, and
    TE's fusion on in the same modules of Bridge's (which cannot build the setting itself without APEX)."""
    from bridge_cudagraph.config import CudaGraphConfig, LanguageGraphConfig
    from bridge_cudagraph.examples import tiny
    from bridge_cudagraph.host.wgrad_fusion import fuse_te_modules, te_modules_fusing

    fields = dict(seq_length=seq, language_max_sequence_length=seq)
    plugin = dict(fields, gradient_accumulation_fusion=fused)
    graphed_provider = tiny.tiny_qwen3_vl_provider(
        CudaGraphConfig(language=LanguageGraphConfig(enabled=True)), **plugin
    )
    graphed = tiny.build(graphed_provider, world.language, vision_pg_collection=world.vision)
    ours_off = tiny.build(
        tiny.tiny_qwen3_vl_provider(None, **plugin), world.language, vision_pg_collection=world.vision
    )
    tiny.copy_weights(graphed, ours_off)
    bridge = tiny.upstream_provider(tiny.tiny_qwen3_vl_provider(None, **fields))
    bridge.cuda_graph_impl = "none"  # Bridge's unmodified provider, graphs off
    bridge_model = tiny.build(bridge, world.language)
    if fused:
        fusing = fuse_te_modules(bridge_model[0], bridge)
        assert fusing > 0 and te_modules_fusing(graphed[0]) == te_modules_fusing(ours_off[0]) == fusing
    tiny.copy_weights(graphed, bridge_model)
    return graphed, ours_off, bridge_model


def _assert_match(a, b, what: str, floor: float | None) -> None:
    import torch

    from bridge_cudagraph.testing.parity import grads_differ, nonfinite_grads

    la, ga = a
    lb, gb = b
    assert torch.isfinite(la).all(), f"{what}: non-finite loss"
    assert not nonfinite_grads(ga), f"{what}: non-finite gradients {nonfinite_grads(ga)[:3]}"
    one_side = [n for n in gb if (ga.get(n) is None) != (gb[n] is None)]
    assert not one_side, f"{what}: a gradient on one side only: {one_side[:3]}"
    if DETERMINISTIC:
        assert torch.equal(la, lb), f"{what}: per-token loss differs, max {float((la - lb).abs().max())}"
        bad = grads_differ(ga, gb)
        assert not bad, f"{what}: {len(bad)} gradients differ, e.g. {bad[:3]}"
        return
    d = float((la - lb).abs().max())
    assert d <= floor, f"{what}: per-token loss max diff {d} above the eager-vs-eager floor {floor}"


# The static attention max_seqlen: the model's seq_length (what the plan uses), and 4x it. Eager attention gets the
# micro-batch's own longest row; the second case shows whether the kernels' numbers depend on max_seqlen.
# ``fused``: with gradient_accumulation_fusion=true, which the packed replay marks before each replay.
# ``unit``: the language graph unit; ``deepstack`` (the product's default) captures layers 2-3 of the tiny model as one
# graph (a deepstack merge follows layers 0 and 1), so a budget holds 3 graphs instead of 4.
@pytest.mark.parametrize(
    ("max_seqlen", "fused", "fewer_waits", "unit"),
    [
        (SEQ, False, False, "layer"),
        (4 * SEQ, False, False, "layer"),
        (SEQ, True, False, "layer"),
        (SEQ, True, True, "layer"),
        (SEQ, True, True, "run"),
    ],
    ids=[
        "max_seqlen_S",
        "max_seqlen_4S",
        "max_seqlen_S_fused",
        "max_seqlen_S_fused_fewer_waits",
        "max_seqlen_S_fused_fewer_waits_runs",
    ],
)
def test_packed_graphs_match_eager_and_bridge(world, record, max_seqlen, fused, fewer_waits, unit):
    """``fewer_waits``: the graphed model also runs Qwen3-VL's forward with fewer host waits
    (:mod:`bridge_cudagraph.host.forward`, as the callback installs it with the graphs): the step's packed rows take
    its positions, go to Bridge's forward flat and take its deepstack merge, stay exact against both references;
    a forward and backward waits less often than Bridge's model, and at least the forward's packing waits less than
    the same model with Bridge's packing (counted, recorded); a mask that drops tokens raises."""
    import torch

    from bridge_cudagraph.capture.packed import PackedLanguageGraphHelper, PackedLayout
    from bridge_cudagraph.host import forward as forward_host
    from bridge_cudagraph.testing.parity import loss_and_grads

    graphed, ours_off, bridge = _models(world, fused=fused)
    layout = PackedLayout(budgets=BUDGETS, max_sequences=MBS, max_seqlen=max_seqlen)
    batches = {
        name: _packed_batch(rows, seed=11 * i, pg_collection=world.language)
        for i, (name, rows) in enumerate(CASES.items())
    }
    fallback = _packed_batch(FALLBACK, seed=99, pg_collection=world.language)
    for batch in batches.values():
        assert batch["packed_seq_params"].cu_seqlens_q_padded is not None

    # Before capture the three models run the same kernels: exact, and the eager-vs-eager floor for later.
    floors = {}
    for name, batch in batches.items():
        a, b, c = loss_and_grads(graphed, batch), loss_and_grads(ours_off, batch), loss_and_grads(bridge, batch)
        again = loss_and_grads(ours_off, batch)
        floors[name] = float((b[0] - again[0]).abs().max())
        _assert_match(b, c, f"{name}: plugin graphs-off vs Bridge", floors[name])
        _assert_match(a, b, f"{name}: before capture", floors[name])

    from bridge_cudagraph.examples import tiny
    from bridge_cudagraph.plan.build import deepstack_merges
    from bridge_cudagraph.plan.facts import model_facts

    merges = deepstack_merges(model_facts(tiny.tiny_qwen3_vl_provider()))  # the tiny encoder's 2 deepstack taps
    helper = PackedLanguageGraphHelper(graphed, layout=layout, graph_unit=unit, deepstack_merges=merges)
    waits = forward_host.install(graphed) if fewer_waits else forward_host.ForwardInstall()
    helper.create_cudagraphs()
    assert helper.stats.failed is None, helper.stats.failed
    assert helper.graphs_created() and helper.stats.graphs == {"layer": 4, "run": 3}[unit] * len(BUDGETS)

    for name, batch in batches.items():
        tokens = batch["input_ids"].numel()
        before = helper.stats.replays
        got = loss_and_grads(graphed, batch)
        assert helper.stats.replays == before + 1, f"{name} did not replay"
        _assert_match(got, loss_and_grads(ours_off, batch), f"{name}: graphs vs plugin eager", floors[name])
        _assert_match(got, loss_and_grads(bridge, batch), f"{name}: graphs vs Bridge", floors[name])
        record(
            case=name,
            max_seqlen=max_seqlen,
            fused=fused,
            tokens=tokens,
            budget=layout.budget_for(tokens, MBS),
            fill=tokens / BUDGETS[-1],
            deterministic=DETERMINISTIC,
            floor=floors[name],
            unit=unit,
        )
    fills = sorted(round(b["input_ids"].numel() / BUDGETS[-1], 2) for b in batches.values())
    assert fills[0] <= 0.35 and 0.65 <= fills[1] <= 0.75 and fills[2] == 1.0, fills

    before = helper.stats.eager_fallbacks
    got = loss_and_grads(graphed, fallback)
    assert helper.stats.eager_fallbacks == before + 1
    ref = loss_and_grads(ours_off, fallback)
    assert torch.equal(got[0], ref[0]), "an eager fallback must be the eager model itself"
    assert math.isfinite(float(got[0].sum()))
    record(
        case="fallback",
        eager_fallbacks=helper.stats.eager_fallbacks,
        replays=helper.stats.replays,
        graph_memory_mib=helper.stats.graph_memory_bytes / 2**20,
        capture_s=helper.stats.seconds,
    )
    if fewer_waits:
        from benchmarks.host_syncs import census

        counts = forward_host.counts(waits)
        calls, merged, flat = counts["cpu_positions_calls"], counts["row_merges"], counts["flat_batches"]
        assert forward_host.counts_in(graphed) == counts  # the one install on these models
        record(case="fewer host waits", cpu_positions_calls=calls, row_merges=merged, flat=flat)
        assert calls == len(batches) + 1  # every graphed call, the fallback too
        assert 0 < merged <= calls  # the image-token merge by rows, in calls with images
        assert flat == calls  # every one of the step's packed batches went to Bridge flat
        # A forward and backward of the step's packed rows with images: how often the host waits for the GPU.
        batch = batches["fill_70"]
        ours = census(lambda: loss_and_grads(graphed, batch))["total"]
        theirs = census(lambda: loss_and_grads(bridge, batch))["total"]
        assert ours < theirs, (ours, theirs)
        # The step's all-ones mask is what makes Bridge's packing the flatten: one that drops a token raises (from
        # the host copy, before the language model runs), and the model then runs the next batch as before.
        dropped = batch["attention_mask"].clone()
        dropped[0, -1] = False
        with pytest.raises(RuntimeError, match=r"forward\.flat_rows=false"):
            loss_and_grads(graphed, {**batch, "attention_mask": dropped})
        assert flat == forward_host.counts(waits)["flat_batches"] - 2  # the census's one, and the raising one
        _assert_match(
            loss_and_grads(graphed, batch), loss_and_grads(bridge, batch), "after the raise", floors["fill_70"]
        )
        # The same graphed model with Bridge's packing (FlatPackedRows alone taken off): its forward alone waits for
        # each of its packing calls (tokens, embeddings, positions, one per deepstack feature) three times plus
        # once per row; the backward more.
        forward_host.uninstall(waits, ["FlatPackedRows"])
        packing = census(lambda: loss_and_grads(graphed, batch))["total"]
        record(case="host waits per packed forward and backward", ours=ours, bridge_packing=packing, bridge=theirs)
        rows = batch["input_ids"].shape[0]
        assert packing - ours >= (3 + merges) * (3 + rows), (ours, packing, theirs)
    helper.uninstall()
    forward_host.uninstall(waits)
    assert not helper.graphs_created() and not forward_host.installed(graphed)


# Rows as the main job's photo micro-batches make them at sequence 2048 (every width a multiple of 128): packed widths
# from 2 x 640 to 2 x 2048, replaying several rungs of the plan's own ladder. Written after run 16, where Bridge's
# loop on the photo data parted from eager from its second graphed step under deterministic kernels while the
# single-budget cases above stay exact.
LADDER_SEQ = 2048
LADDER_CASES = {
    "T_1280": [(640, [(1, 16, 16)]), (500, [(1, 12, 12)])],
    "T_2048": [(1024, [(1, 24, 16)]), (900, [(1, 16, 12)])],
    "T_2816": [(1408, [(1, 32, 24)]), (1300, [(1, 20, 20)])],
    "T_4096": [(2048, [(1, 32, 32)]), (1990, [(1, 24, 24)])],
}


def test_packed_graphs_over_the_plans_ladder_at_sequence_2048(world, record):
    from bridge_cudagraph.capture.packed import PackedLanguageGraphHelper
    from bridge_cudagraph.plan.budgets import PackedLayout, derive_language_budgets
    from bridge_cudagraph.testing.parity import assert_captured, loss_and_grads

    graphed, ours_off, bridge = _models(world, LADDER_SEQ)
    budgets = tuple(derive_language_budgets(MBS * LADDER_SEQ, multiple=MBS * 16))
    layout = PackedLayout(budgets=budgets, max_sequences=MBS, max_seqlen=LADDER_SEQ)
    batches = {
        name: _packed_batch(rows, seed=13 * i, pg_collection=world.language, seq=LADDER_SEQ)
        for i, (name, rows) in enumerate(LADDER_CASES.items())
    }
    floors = {}
    for name, batch in batches.items():
        b, again = loss_and_grads(ours_off, batch), loss_and_grads(ours_off, batch)
        floors[name] = float((b[0] - again[0]).abs().max())
    helper = PackedLanguageGraphHelper(graphed, layout=layout)
    helper.create_cudagraphs()
    assert helper.stats.failed is None, helper.stats.failed
    used = set()
    for step in range(2):  # twice over: the second pass replays every budget again, as training steps do
        for name, batch in batches.items():
            tokens = batch["input_ids"].numel()
            used.add(layout.budget_for(tokens, MBS))
            got = loss_and_grads(graphed, batch)
            _assert_match(got, loss_and_grads(ours_off, batch), f"{name} pass {step}: graphs vs eager", floors[name])
            _assert_match(got, loss_and_grads(bridge, batch), f"{name} pass {step}: graphs vs Bridge", floors[name])
            record(
                case=name, step=step, tokens=tokens, budget=layout.budget_for(tokens, MBS), deterministic=DETERMINISTIC
            )
    assert len(used) >= 3, used  # several rungs, not one
    assert helper.stats.replays == 2 * len(batches) and helper.stats.eager_fallbacks == 0
    assert_captured(helper.stats)
    helper.uninstall()


def test_ladder_rungs_share_one_pool_follow_the_data_and_replay_in_any_order(world, record):
    """The ladder's memory and its top (:class:`bridge_cudagraph.capture.budget_ladder.BudgetLadder`,
    :func:`~bridge_cudagraph.capture.ladder_capture.capture_budget_ladder`).

    One eager micro-batch before capture sets the captured top (the rung that holds it, not the ladder's); the rungs
    share one pool: all of them together take at most 1.25x the largest alone (the 2B benchmark gives the product's
    figure). Then micro-batches replay in an order unlike the capture order (largest first), interleaved with eager
    ones (above the captured top, and with more sequences than the graphs hold), each bit-exact against the plugin's
    model with graphs off and Bridge's unmodified model (deterministic kernels; else within the eager floor). The rung
    the larger micro-batch asked for is captured between "steps" (:meth:`capture_pending`: the ladder re-captured up to
    the new top into one pool), and replays exactly too; the earlier rungs still do after it."""
    from bridge_cudagraph.capture.device_memory import held_reserved
    from bridge_cudagraph.capture.packed import PackedLanguageGraphHelper
    from bridge_cudagraph.examples import tiny
    from bridge_cudagraph.plan.budgets import PackedLayout, derive_language_budgets
    from bridge_cudagraph.plan.build import deepstack_merges
    from bridge_cudagraph.plan.facts import model_facts
    from bridge_cudagraph.testing.parity import assert_captured, loss_and_grads

    graphed, ours_off, bridge = _models(world, LADDER_SEQ)
    budgets = tuple(derive_language_budgets(MBS * LADDER_SEQ, multiple=MBS * 16))
    layout = PackedLayout(budgets=budgets, max_sequences=MBS, max_seqlen=LADDER_SEQ)
    batches = {
        name: _packed_batch(rows, seed=17 * i, pg_collection=world.language, seq=LADDER_SEQ)
        for i, (name, rows) in enumerate(LADDER_CASES.items())
    }
    batches["three_rows"] = _packed_batch(FALLBACK, seed=5, pg_collection=world.language, seq=LADDER_SEQ)
    floors = {}
    for name, batch in batches.items():
        b, again = loss_and_grads(ours_off, batch), loss_and_grads(ours_off, batch)
        floors[name] = float((b[0] - again[0]).abs().max())
    merges = deepstack_merges(model_facts(tiny.tiny_qwen3_vl_provider()))
    helper = PackedLanguageGraphHelper(graphed, layout=layout, graph_unit="run", deepstack_merges=merges)
    seen = batches["T_2048"]["input_ids"].numel()
    loss_and_grads(graphed, batches["T_2048"])  # an eager training micro-batch before capture: the data's largest
    helper.create_cudagraphs()
    stats = helper.stats
    assert stats.failed is None and stats.graphs > 0, stats.failed
    first_top = layout.budget_for(seen, MBS)
    assert stats.budgets_captured == tuple(b for b in budgets if b <= first_top), (stats.budgets_captured, budgets)
    assert first_top < budgets[-1] and str(seen) in stats.budget_source
    pools = sum(stats.per_budget.values())
    record(
        case="ladder memory",
        captured=list(stats.budgets_captured),
        ladder=list(budgets),
        per_budget=dict(stats.per_budget),
        per_budget_live=dict(stats.per_budget_live),
        pools_over_top=pools / stats.per_budget[first_top],
        param_grads_cloned=stats.param_grads_cloned,
        param_grads_summed=stats.param_grads_summed,
    )
    assert pools <= 1.25 * stats.per_budget[first_top], (pools, stats.per_budget)
    assert stats.param_grads_summed > 0 and stats.param_grads_cloned is False  # capture.param_grads

    def check(name: str, graphed_run: bool) -> None:
        before = (stats.replays, stats.eager_fallbacks)
        got = loss_and_grads(graphed, batches[name])
        assert (stats.replays - before[0], stats.eager_fallbacks - before[1]) == ((1, 0) if graphed_run else (0, 1)), (
            name,
            graphed_run,
            stats,
        )
        _assert_match(got, loss_and_grads(ours_off, batches[name]), f"{name}: graphs vs plugin eager", floors[name])
        _assert_match(got, loss_and_grads(bridge, batches[name]), f"{name}: graphs vs Bridge", floors[name])
        record(case="ladder order", batch=name, graphed=graphed_run, tokens=batches[name]["input_ids"].numel())

    # Smallest rung, then one above the captured top (eager, asks for its rung), the top, too many sequences (eager),
    # a middle rung, the smallest again.
    for name, graphed_run in [
        ("T_1280", True),
        ("T_4096", False),
        ("T_2048", True),
        ("three_rows", False),
        ("T_2816", False),
        ("T_1280", True),
    ]:
        check(name, graphed_run)
    assert stats.above_captured == 2 and helper.pending_budgets(), (stats.above_captured, helper.pending_budgets())
    old_pool, reserved_before = sum(stats.per_budget.values()), held_reserved()
    grown = helper.capture_pending()
    assert grown and grown[-1] == layout.budget_for(batches["T_4096"]["input_ids"].numel(), MBS), grown
    assert stats.late_captures == len(grown) and not helper.pending_budgets()
    new_pool, reserved_after = sum(stats.per_budget.values()), held_reserved()
    record(
        case="ladder grown",
        grown=list(grown),
        per_budget=dict(stats.per_budget),
        graphs=stats.graphs,
        old_pool=old_pool,
        new_pool=new_pool,
        reserved_growth=reserved_after - reserved_before,
    )
    # The re-capture gives the old pool back: reserved memory grows by the new pool less the old one (a 64 MiB
    # allowance for the caching allocator's rounding), not by the whole new pool.
    assert reserved_after - reserved_before <= new_pool - old_pool + 64 * 2**20, (
        reserved_after - reserved_before,
        new_pool,
        old_pool,
    )
    # Grown by a re-capture up to the new top, largest first: one pool of about one rung again.
    assert stats.budgets_captured == budgets and stats.failed is None
    assert sum(stats.per_budget.values()) <= 1.25 * stats.per_budget[budgets[-1]], stats.per_budget
    for name in ("T_4096", "T_2816", "T_1280", "T_2048", "T_4096"):
        check(name, True)
    assert_captured(stats)
    helper.uninstall()
    assert not helper.graphs_created()


# GPT SFT offline packing (Bridge's GPTSFTDatasetConfig with enable_offline_packing, pad_cu_seqlens): the rows of
# recipes/tiny_gpt_packed.yaml, packed by Bridge's own packer and collate, handed to the model by Bridge's gpt_step.
GPT_RECIPE = "recipes/tiny_gpt_packed.yaml"
GPT_ROWS = 6


def _gpt_config(*overrides: str):
    from bridge_cudagraph.plan.from_config import finalize_config
    from bridge_cudagraph.recipe.load import load_recipe

    cfg = load_recipe(GPT_RECIPE, overrides).config
    finalize_config(cfg, world_size=1)
    return cfg


@pytest.mark.parametrize("pad_seq_to_mult", [1, 8], ids=["no_padding_between", "pad_seq_to_mult_8"])
def test_offline_packed_gpt_rows_replay_exactly(world, record, tmp_path, pad_seq_to_mult):
    """Packed GPT rows from Bridge's real data path: the plan of the recipe (one budget of seq_length, static
    ``cu_seqlens``), the helper the provider builds from it, every row replayed; per-token loss and every gradient
    equal to the plugin's graphs-off model and to Bridge's unmodified ``GPTModelProvider`` (deterministic mode:
    bit-exact; otherwise within the eager-vs-eager floor). A helper whose ``max_sequences`` is below the rows'
    segment count runs them eagerly, counted, and equal to eager."""
    import torch

    from bridge_cudagraph.capture.packed import PackedLanguageGraphHelper
    from bridge_cudagraph.examples import tiny
    from bridge_cudagraph.examples.gpt_packed import packed_microbatches
    from bridge_cudagraph.plan.budgets import PackedLayout
    from bridge_cudagraph.plan.from_config import plan_config
    from bridge_cudagraph.testing.parity import assert_captured, loss_and_grads
    from bridge_cudagraph.testing.step_batch import gpt_step_inputs

    mult = f"dataset.offline_packing_specs.pad_seq_to_mult={pad_seq_to_mult}"
    cfg = _gpt_config(mult)
    plan = plan_config(cfg, world_size=1, finalized=True)
    packed = plan.language.packed
    assert packed is not None and packed.offline and packed.token_budgets == (cfg.model.seq_length,)
    assert packed.separate_padded == (pad_seq_to_mult > 1)
    graphed = tiny.build(cfg.model, world.language)
    off_cfg = _gpt_config(mult, "model.cuda_graph.language.enabled=false")
    ours_off = tiny.build(off_cfg.model, world.language)
    tiny.copy_weights(graphed, ours_off)
    bridge_provider = tiny.upstream_provider(off_cfg.model)
    bridge_provider.cuda_graph_impl = "none"  # Bridge's unmodified GPTModelProvider, graphs off
    bridge = tiny.build(bridge_provider, world.language)
    tiny.copy_weights(graphed, bridge)

    seq = cfg.model.seq_length
    rows = packed_microbatches(GPT_ROWS, seq, cache=tmp_path, pad_seq_to_mult=pad_seq_to_mult)
    batches = [gpt_step_inputs(r, cfg, world.language) for r in rows]
    for b in batches:
        params = b["packed_seq_params"]
        assert b["input_ids"].shape == (1, seq) and params.qkv_format == "thd"
        assert (params.cu_seqlens_q_padded is not None) == (pad_seq_to_mult > 1)
    floors = {}
    for i, batch in enumerate(batches):
        a, b, c = loss_and_grads(graphed, batch), loss_and_grads(ours_off, batch), loss_and_grads(bridge, batch)
        floors[i] = float((b[0] - loss_and_grads(ours_off, batch)[0]).abs().max())
        _assert_match(b, c, f"row {i}: plugin graphs-off vs Bridge", floors[i])
        _assert_match(a, b, f"row {i}: before capture", floors[i])

    (helper,) = cfg.model.make_graph_helpers(graphed, plan=plan)
    assert isinstance(helper, PackedLanguageGraphHelper)
    helper.create_cudagraphs()
    # GPT merges nothing between layers: the plan's one run of every layer, one graph per budget.
    layers = cfg.model.num_layers
    assert plan.language.graph_unit == "run" and plan.language.segments_per_stage == (((0, layers),),)
    assert helper.stats.failed is None and helper.stats.graphs == 1, helper.stats.failed
    for i, batch in enumerate(batches):
        before = helper.stats.replays
        got = loss_and_grads(graphed, batch)
        assert helper.stats.replays == before + 1, f"row {i} did not replay ({helper.stats.eager_fallbacks} eager)"
        _assert_match(got, loss_and_grads(ours_off, batch), f"row {i}: graphs vs plugin eager", floors[i])
        _assert_match(got, loss_and_grads(bridge, batch), f"row {i}: graphs vs Bridge", floors[i])
        params = batch["packed_seq_params"]
        record(
            case=f"gpt_row_{i}",
            pad_seq_to_mult=pad_seq_to_mult,
            sequences=int((params.cu_seqlens_q.diff() > 0).sum()),
            cu_seqlens_length=params.cu_seqlens_q.numel(),
            max_seqlen=params.max_seqlen_q,
            fill=float(batch["loss_mask"].sum()) / seq,
            deterministic=DETERMINISTIC,
            floor=floors[i],
        )
    assert_captured(helper.stats, where="offline-packed GPT")
    helper.uninstall()

    # Fewer static sequences than the rows' boundaries: every row runs eagerly, counted, and is the eager model.
    small = PackedLanguageGraphHelper(
        graphed,
        layout=PackedLayout((seq,), max_sequences=4, max_seqlen=seq),
        separate_padded=pad_seq_to_mult > 1,
    )
    small.create_cudagraphs()
    assert small.graphs_created()
    got = loss_and_grads(graphed, batches[0])
    assert small.stats.eager_fallbacks == 1 and small.stats.replays == 0
    ref = loss_and_grads(ours_off, batches[0])
    assert torch.equal(got[0], ref[0]), "an eager fallback must be the eager model itself"
    record(case="gpt_fallback", pad_seq_to_mult=pad_seq_to_mult, eager_fallbacks=small.stats.eager_fallbacks)
    small.uninstall()


# Tight packing: photo-like micro-batches of two rows of different lengths (one photo each, or text only), padded to
# the longer row by the collate and the step; the replay drops each row's tail and runs the graphs on the kept tokens.
TIGHT_CASES = {
    "long_then_short": [(440, [(1, 16, 16)]), (130, [(1, 8, 8)])],
    "short_then_long": [(96, []), (384, [(1, 12, 16)])],
    "a_third_shorter": [(300, [(1, 8, 12)]), (200, [(1, 8, 8)])],
}


def test_tight_packing_replays_the_kept_tokens_exactly(world, record):
    """The graphs run on each row's kept prefix at the smallest budget that holds it (below the budget the padded
    rows need); per-token loss on every kept token equals Bridge's eager row form (bit for bit under deterministic
    kernels), the gradients equal the same compaction run eagerly (the host's layers on the very static inputs the
    replay reads) bit for bit, and equal Bridge's bit for bit under deterministic kernels (without them: within
    Bridge's own run-to-run spread or bf16 noise). ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0`` for the exact assertions."""
    import torch

    from bridge_cudagraph.capture.packed import PackedGraphSet, PackedLanguageGraphHelper, _PackedLanguageLayer
    from bridge_cudagraph.capture.segments import segment_callables
    from bridge_cudagraph.capture.tight import tight_rows
    from bridge_cudagraph.examples import tiny
    from bridge_cudagraph.host import forward as forward_host
    from bridge_cudagraph.micro_batch import row_extents
    from bridge_cudagraph.plan.budgets import PackedLayout, derive_language_budgets
    from bridge_cudagraph.plan.build import deepstack_merges
    from bridge_cudagraph.plan.facts import model_facts
    from bridge_cudagraph.testing.parity import assert_captured, diff, grads_differ, loss_and_grads, nonfinite_grads

    graphed, _, bridge = _models(world)
    layout = PackedLayout(tuple(derive_language_budgets(MBS * SEQ, MBS * 16)), max_sequences=MBS, max_seqlen=SEQ)
    batches = {
        name: _packed_batch(rows, seed=23 + 7 * i, pg_collection=world.language)
        for i, (name, rows) in enumerate(TIGHT_CASES.items())
    }
    qwen = graphed[0].module.module
    visual_ids = (qwen.image_token_id, qwen.video_token_id)
    kept = {}
    for name, batch in batches.items():
        ids = batch["input_ids"].cpu()
        rows = tight_rows(row_extents(batch["loss_mask"].cpu(), ids, visual_ids), ids.size(1))
        full = layout.budget_for(rows.full_tokens, MBS)
        assert rows.tokens < rows.full_tokens and layout.budget_for(rows.tokens, MBS) < full, (name, rows, full)
        kept[name] = rows

    merges = deepstack_merges(model_facts(tiny.tiny_qwen3_vl_provider()))
    helper = PackedLanguageGraphHelper(
        graphed, layout=layout, graph_unit="run", deepstack_merges=merges, on_capture_error="raise", tight=True
    )
    waits = forward_host.install(graphed)
    # Before capture: the host's forward (unchanged), exact against Bridge; the ladder observes the kept tokens.
    floors, grad_floors = {}, {}
    for name, batch in batches.items():
        a, b = loss_and_grads(graphed, batch), loss_and_grads(bridge, batch)
        again = loss_and_grads(bridge, batch)
        floors[name] = float((b[0] - again[0]).abs().max())
        grad_floors[name] = diff(again, b).grad_max_rel_l2  # Bridge vs Bridge: 0 under deterministic kernels
        _assert_match(a, b, f"{name}: before capture", floors[name])
    assert helper.ladder.seen == max(r.tokens for r in kept.values())
    helper.create_cudagraphs()
    assert helper.stats.failed is None, helper.stats.failed
    assert helper.ladder.captured[-1] == layout.budget_for(helper.ladder.seen, MBS)

    decoder = helper.decoders[0]
    for name, batch in batches.items():
        rows = kept[name]
        budget = layout.budget_for(rows.tokens, MBS)
        before, tight_before = helper.stats.replays, helper.tight_replays
        dropped = helper.tight_dropped_tokens
        got = loss_and_grads(graphed, batch)
        assert helper.stats.replays == before + 1 and helper.tight_replays == tight_before + 1, f"{name}: no replay"
        assert helper.tight_dropped_tokens - dropped == rows.full_tokens - rows.tokens
        # The same compaction, eagerly: the host's layers on the static inputs the replay reads at this budget.
        replayed = helper.graphs[budget][0]
        eager_layers = segment_callables(
            list(decoder.layers), helper.segments[0], lambda layer: _PackedLanguageLayer(layer, layout.max_seqlen)
        )
        helper.graphs[budget][0] = PackedGraphSet(
            list(eager_layers), replayed.rotary, replayed.cu_seqlens, replayed.cu_seqlens_padded
        )
        try:
            same_compaction = loss_and_grads(graphed, batch)
        finally:
            helper.graphs[budget][0] = replayed
        reference = loss_and_grads(bridge, batch)
        for what, res in (("graphs", got), ("compacted eager", same_compaction), ("Bridge", reference)):
            assert torch.isfinite(res[0]).all() and not nonfinite_grads(res[1]), f"{name}: {what} not finite"
        index = rows.gather_index().to(got[0].device)
        mine, bridges = got[0].reshape(-1)[index], reference[0].reshape(-1)[index]
        _assert_match(got, same_compaction, f"{name}: graphs vs compacted eager", floors[name])
        vs_bridge = diff(got, reference)
        if DETERMINISTIC:
            assert torch.equal(mine, bridges), f"{name}: kept tokens' loss differs, max {(mine - bridges).abs().max()}"
            # Measured bit-exact on these three micro-batches (results/full-iteration-graph/run67): dropping the rows'
            # zero-gradient tails left every weight-gradient sum as Bridge's. A shape where it does not is the padding
            # effect of tests/gpu/test_vision_padding.py and should be looked at, not bounded away. (Run 75 found one:
            # with the weights this file's earlier tests leave, the final norm's weight gradient summed over the kept
            # rows alone differed in its last bits; the replay now norms the full rows, as Bridge does.)
            differing = grads_differ(got[1], reference[1])
            assert not differing, f"{name}: {len(differing)} gradients differ from Bridge's, e.g. {differing[:3]}"
        else:
            assert float((mine - bridges).abs().max()) <= floors[name], f"{name}: kept tokens' loss above the floor"
        # The weight gradients reduce over T' rows in another order than Bridge's T: bf16 noise, or Bridge's own
        # run-to-run spread where that is larger (without deterministic kernels).
        bound = max(1e-3, 2 * grad_floors[name])
        assert vs_bridge.grad_max_rel_l2 <= bound, f"{name}: gradients vs Bridge {vs_bridge.grad_max_rel_l2} > {bound}"
        record(
            case=name,
            full_tokens=rows.full_tokens,
            kept_tokens=rows.tokens,
            budget=budget,
            budget_without_tight=layout.budget_for(rows.full_tokens, MBS),
            kept_loss_exact=bool(torch.equal(mine, bridges)),
            grads_differing_vs_bridge=len(grads_differ(got[1], reference[1])),
            grad_max_rel_l2_vs_bridge=vs_bridge.grad_max_rel_l2,
            deterministic=DETERMINISTIC,
            floor=floors[name],
            grad_floor=grad_floors[name],
        )
    assert_captured(helper.stats)
    assert helper.stats.eager_fallbacks == 0
    helper.uninstall()
    forward_host.uninstall(waits)
