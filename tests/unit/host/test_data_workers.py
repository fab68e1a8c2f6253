"""host.data_workers: Bridge's photo data path through a DataLoader with forked workers delivers its batches (on the
CPU, Bridge's own dataset provider and Qwen-VL collate; the hang reproduced on this machine kind without the fix), and
so does the multi-image conversation recipe's, through Bridge's own train data loader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bridge_cudagraph.host.data_workers import TOKENIZERS_PARALLELISM, fork_safe_tokenizers

ROOT = Path(__file__).resolve().parents[3]

#: A fresh process: the photo set and processor built (as the recipe function does), Bridge's dataset, then batches
#: drawn by a DataLoader with Bridge's default of two forked workers, within the fix or not (argv[2]).
DRAW = textwrap.dedent(
    """
    import contextlib, sys, time
    import torch
    from megatron.bridge.data.utils import get_dataset_provider
    from bridge_cudagraph.examples.photo_recipe import build_photo_data, photo_dataset_config
    from bridge_cudagraph.examples.photos import PhotoSetSpec
    from bridge_cudagraph.host.data_workers import fork_safe_tokenizers

    photos, processor = build_photo_data(sys.argv[1], PhotoSetSpec(sizes=(8, 2, 2)))
    config = photo_dataset_config(photos, processor, seq_length=2048)
    config.finalize()
    train, _, _ = get_dataset_provider(config)([8, 0, 0], config, tokenizer=None)
    fix = fork_safe_tokenizers(2) if sys.argv[2] == "fix" else contextlib.nullcontext()
    with fix:
        loader = torch.utils.data.DataLoader(train, batch_size=2, collate_fn=train.collate_fn, num_workers=2,
                                             timeout=float(sys.argv[3]))
        start = time.perf_counter()
        try:
            batches = [b for _, b in zip(range(3), loader)]
        except RuntimeError as error:
            print("HANG", error)
            sys.exit(3)
    print("DELIVERED", len(batches), sorted(batches[0]), round(time.perf_counter() - start, 1))
    """
)


def _draw(tmp_path: Path, mode: str, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != TOKENIZERS_PARALLELISM}
    env["HF_DATASETS_OFFLINE"] = "1"
    return subprocess.run(
        [sys.executable, "-c", DRAW, str(tmp_path), mode, str(timeout)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


#: A fresh process: the conversation recipe's ConfigContainer (its set and processor built), Bridge's datasets and its
#: train data loader (``build_pretraining_data_loader``: the recipe's cyclic sampler, micro-batch, workers, pinning),
#: drawn through Bridge's ``cyclic_iter`` as its training loop does, within the fix; a worker that never delivers ends
#: the draw at the loader's timeout (argv[2] seconds).
DRAW_CONVERSATIONS = textwrap.dedent(
    """
    import functools, json, sys, time
    from megatron.bridge.data.loaders import build_train_valid_test_datasets, cyclic_iter
    from megatron.bridge.data.samplers import build_pretraining_data_loader
    from megatron.bridge.data.utils import get_dataset_provider
    from bridge_cudagraph.examples.conversations_recipe import tiny_qwen3_vl_conversations_config
    from bridge_cudagraph.host.data_workers import fork_safe_tokenizers

    cfg = tiny_qwen3_vl_conversations_config(train_iters=6, cache=sys.argv[1])
    cfg.dataset.finalize()
    provider = functools.partial(get_dataset_provider(cfg.dataset), tokenizer=None)
    train, _, _ = build_train_valid_test_datasets(cfg, provider)
    d = cfg.dataset
    with fork_safe_tokenizers(d.num_workers):
        loader = build_pretraining_data_loader(
            train, 0, d.dataloader_type, cfg.train.micro_batch_size, d.num_workers, d.data_sharding,
            collate_fn=train.collate_fn, pin_memory=d.pin_memory, persistent_workers=d.persistent_workers,
            global_batch_size=cfg.train.global_batch_size,
        )
        loader.timeout = float(sys.argv[2])
        start = time.perf_counter()
        try:
            batches = [b for _, b in zip(range(6), cyclic_iter(loader))]
        except RuntimeError as error:
            print("HANG", error)
            sys.exit(3)
    grids = [b["visual_inputs"].normalized_for_model().get("image_grid_thw") for b in batches]
    images = [0 if g is None else int(g.shape[0]) for g in grids]  # 0: two text-only samples
    seconds = round(time.perf_counter() - start, 1)
    print("DELIVERED", json.dumps({"batches": len(batches), "workers": loader.num_workers, "images": images,
                                   "seconds": seconds}))
    """
)


def test_two_forked_workers_deliver_bridges_photo_batches(tmp_path, record):
    done = _draw(tmp_path, "fix", 90)
    record(returncode=done.returncode, out=done.stdout.strip()[-300:])
    assert done.returncode == 0 and "DELIVERED 3" in done.stdout, done.stdout + done.stderr[-2000:]
    assert "input_ids" in done.stdout


def test_without_the_fix_the_workers_never_deliver_here(tmp_path, record):
    """The control: the same process without the fix waits on its workers until the loader's timeout (seen on this
    machine kind, 2026-12-04: ``results/data-workers/workers_cpu.json``; on the H200 machine in Bridge's loop, issue
    #48). Where the tokenizer does not hang (another machine, another tokenizers release) there is nothing to show:
    skipped, said."""
    done = _draw(tmp_path, "plain", 30)
    record(returncode=done.returncode, out=done.stdout.strip()[-300:])
    if done.returncode == 0:
        pytest.skip("the forked workers delivered without the fix on this machine: the hang does not reproduce here")
    assert done.returncode == 3 and "HANG" in done.stdout, done.stdout + done.stderr[-2000:]


def test_the_variable_is_set_only_for_forked_workers_and_never_over_the_users(monkeypatch):
    monkeypatch.delenv(TOKENIZERS_PARALLELISM, raising=False)
    for workers in (0, None):
        with fork_safe_tokenizers(workers) as set_here:
            assert not set_here and TOKENIZERS_PARALLELISM not in os.environ
    with fork_safe_tokenizers(2) as set_here:
        assert set_here and os.environ[TOKENIZERS_PARALLELISM] == "false"
    assert TOKENIZERS_PARALLELISM not in os.environ  # undone
    monkeypatch.setenv(TOKENIZERS_PARALLELISM, "true")
    with fork_safe_tokenizers(2) as set_here:
        assert not set_here and os.environ[TOKENIZERS_PARALLELISM] == "true"


def test_the_conversation_recipes_loader_delivers_with_its_two_workers(tmp_path, record):
    """Bridge's train data loader of ``recipes/tiny_qwen3_vl_conversations.yaml``'s config (two forked workers, up to
    12 images a micro-batch) delivers six micro-batches; a hang fails at the loader's 120 s timeout."""
    env = {k: v for k, v in os.environ.items() if k != TOKENIZERS_PARALLELISM}
    env["HF_DATASETS_OFFLINE"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", DRAW_CONVERSATIONS, str(tmp_path), "120"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    record(returncode=done.returncode, out=done.stdout.strip()[-300:])
    assert done.returncode == 0 and "DELIVERED" in done.stdout, done.stdout + done.stderr[-2000:]
    drawn = json.loads(done.stdout.split("DELIVERED", 1)[1].splitlines()[0])
    assert (drawn["batches"], drawn["workers"]) == (6, 2)
    assert all(0 <= n <= 12 for n in drawn["images"]) and max(drawn["images"]) > 2, drawn
