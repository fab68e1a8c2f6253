"""The conversation set read back as Bridge's training reads it, on CPU: its own source loader and native chat schema
(no adapter), then its dataset provider and Qwen-VL collate."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bridge_cudagraph.examples.conversations import (
    ConversationSetSpec,
    build_conversation_set,
    conversation_sample,
    image_parts,
    user_turns,
)
from bridge_cudagraph.examples.photos import SPLITS
from bridge_cudagraph.examples.processor import SPECIAL_TOKENS

SPEC = ConversationSetSpec(sizes=(32, 4, 4))


def test_samples_are_deterministic_and_of_varied_sizes():
    samples = [conversation_sample(ConversationSetSpec(), "train", i) for i in range(48)]
    sizes = [image.size for _, images in samples for image in images]
    assert min(max(s) for s in sizes) >= 28 and max(max(s) for s in sizes) <= 900 and len(set(sizes)) > 100
    messages, images = conversation_sample(ConversationSetSpec(), "train", 5)
    assert messages == samples[5][0] and [i.tobytes() for i in images] == [i.tobytes() for i in samples[5][1]]


def test_build_is_cached_and_a_moved_cache_is_built_anew(tmp_path):
    first = build_conversation_set(tmp_path / "a", SPEC)
    stamp = (first / "train.parquet").stat().st_mtime_ns
    assert (
        build_conversation_set(tmp_path / "a", SPEC) == first and (first / "train.parquet").stat().st_mtime_ns == stamp
    )
    # The rows name their images by absolute path: another root is another folder, whose rows name its own images.
    second = build_conversation_set(tmp_path / "b", SPEC)
    assert second.parent.name != first.parent.name and sorted(p.name for p in second.iterdir()) == [
        f"{split}.parquet" for split in sorted(SPLITS)
    ]
    a, b = sorted((first.parent / "images").iterdir()), sorted((second.parent / "images").iterdir())
    assert [p.name for p in a] == [p.name for p in b] and all(
        x.read_bytes() == y.read_bytes() for x, y in zip(a, b, strict=True)
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The set and its processor folder, built as the recipe function builds them."""
    from bridge_cudagraph.examples.conversations_recipe import build_conversation_data

    return build_conversation_data(tmp_path_factory.mktemp("conversations"), SPEC)


def test_bridges_loader_and_native_schema_read_the_promised_conversations(built):
    """1 to 6 images in every sample but the text-only ones (every 8th), several user turns in some, as Bridge's own
    ``load_direct_hf_sft_examples`` (source loader, native chat adapter, chat normalisation) hands them on."""
    from megatron.bridge.data.builders.direct_hf_sft import load_direct_hf_sft_examples
    from megatron.bridge.data.conversation_processing import is_text_only_chat_example
    from megatron.bridge.data.sft_processing import ChatSFTPreprocessingConfig

    from bridge_cudagraph.examples.conversations_recipe import conversation_dataset_config

    folder, processor = built
    config = conversation_dataset_config(folder, processor, seq_length=8192)
    assert config.source.schema_adapter is None
    for split, size in zip(SPLITS, SPEC.sizes, strict=True):
        examples = load_direct_hf_sft_examples(config.source.with_split(split), ChatSFTPreprocessingConfig())
        assert len(examples) == size
    examples = load_direct_hf_sft_examples(config.source, ChatSFTPreprocessingConfig())
    counts = [len(image_parts(e["conversation"])) for e in examples]
    text_only = [i for i, e in enumerate(examples) if is_text_only_chat_example(e)]
    assert text_only == [7, 15, 23, 31] and all(counts[i] == 0 for i in text_only)
    assert sorted({c for i, c in enumerate(counts) if i not in text_only}) == [1, 2, 3, 4, 5, 6]
    turns = [user_turns(e["conversation"]) for e in examples]
    assert set(turns) == {1, 2, 3} and any(t > 1 and i in text_only for i, t in enumerate(turns))
    for example in examples:
        roles = [turn["role"] for turn in example["conversation"]]
        assert roles == ["user", "assistant"] * (len(roles) // 2)
        for path in image_parts(example["conversation"]):
            assert Path(path).is_absolute() and Path(path).is_file()
        # the first user turn opens with the first image (when there is one)
        first = example["conversation"][0]["content"]
        assert (first[0]["type"] == "image") == (counts[examples.index(example)] > 0)


def test_bridges_collate_gives_each_image_its_tokens_and_every_answer_its_loss(built):
    from megatron.bridge.data.utils import get_dataset_provider

    from bridge_cudagraph.examples.conversations_recipe import conversation_dataset_config

    folder, processor = built
    config = conversation_dataset_config(folder, processor, seq_length=8192)
    config.finalize()
    train, _, _ = get_dataset_provider(config)([32, 0, 0], config, tokenizer=None)
    end = SPECIAL_TOKENS["<|im_end|>"]
    for start in range(0, 16, 2):
        pair = [train[start], train[start + 1]]
        batch = train.collate_fn(pair)
        ids, loss = batch["input_ids"], batch["loss_mask"]
        assert "cu_seqlens_q" not in batch and ids.shape[0] == 2 and ids.shape[1] <= 8192
        images = [len(image_parts(example["conversation"])) for example in pair]
        visual = batch["visual_inputs"].normalized_for_model()
        grid = visual.get("image_grid_thw")
        assert (0 if grid is None else grid.shape[0]) == sum(images)
        patches = [] if grid is None else grid.prod(-1).tolist()
        assert all(784 <= p <= 3920 for p in patches)  # the collate's min_pixels / max_pixels at 16x16
        for row in range(2):
            mine = patches[sum(images[:row]) : sum(images[: row + 1])]
            assert int((ids[row] == processor.image_token_id).sum()) == sum(mine) // 4
            # Every assistant turn carries loss: as many loss spans as turns, each through its <|im_end|> (the last
            # position predicts the newline after it).
            where = loss[row].bool()
            spans = int((where[1:] & ~where[:-1]).sum()) + int(where[0])
            assert spans == user_turns(pair[row]["conversation"])
            ends = torch.nonzero(where[:-1] & ~where[1:]).flatten()
            assert len(ends) == spans and all(int(ids[row][e]) == end for e in ends)
