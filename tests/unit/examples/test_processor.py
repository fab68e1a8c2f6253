"""The offline Qwen3-VL processor folder: Qwen3-VL's own template and settings, loadable by ``AutoProcessor``."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from bridge_cudagraph.examples.processor import (
    QWEN3_VL_CHAT_TEMPLATE,
    SPECIAL_TOKENS,
    build_processor_folder,
    processor_files,
)
from bridge_cudagraph.examples.tiny import (
    IMAGE_TOKEN_ID,
    TINY_VOCAB,
    VIDEO_TOKEN_ID,
    VISION_END_TOKEN_ID,
    VISION_START_TOKEN_ID,
)

TEXTS = ["Describe this photo.", *[f"<s_cell>r{i}c{i % 3}</s_cell><s_mean>{i * 7 % 256}</s_mean>" for i in range(300)]]


@pytest.fixture(scope="module")
def processor(tmp_path_factory):
    from transformers import AutoProcessor

    folder = build_processor_folder(tmp_path_factory.mktemp("proc"), TEXTS)
    return folder, AutoProcessor.from_pretrained(str(folder.path))


def test_chat_template_is_qwen3_vl_8b_instructs_byte_for_byte():
    data = QWEN3_VL_CHAT_TEMPLATE.encode()
    assert len(data) == 5292
    assert hashlib.sha256(data).hexdigest() == "3636d0f0bd6bef02654cdffdc447b79cb2cef8ab02cc75267345946291a489e4"


def test_loads_as_qwen3_vl_processor_with_the_tiny_providers_ids(processor):
    folder, proc = processor
    assert type(proc).__name__ == "Qwen3VLProcessor"  # Bridge picks its Qwen-VL collate by this name
    assert (proc.image_token_id, proc.video_token_id) == (IMAGE_TOKEN_ID, VIDEO_TOKEN_ID)
    assert (proc.vision_start_token_id, proc.vision_end_token_id) == (VISION_START_TOKEN_ID, VISION_END_TOKEN_ID)
    assert (folder.image_token_id, folder.vision_end_token_id) == (IMAGE_TOKEN_ID, VISION_END_TOKEN_ID)
    assert proc.tokenizer.pad_token == "<|endoftext|>" and proc.tokenizer.pad_token_id == folder.pad_token_id
    assert len(proc.tokenizer) == folder.vocab_size <= TINY_VOCAB
    for token, wanted in SPECIAL_TOKENS.items():
        assert proc.tokenizer.convert_tokens_to_ids(token) == wanted
    ip = proc.image_processor
    assert (ip.patch_size, ip.temporal_patch_size, ip.merge_size) == (16, 2, 2)
    assert (ip.size["shortest_edge"], ip.size["longest_edge"]) == (65536, 16777216)
    assert proc.video_processor.size["longest_edge"] == 25165824


@pytest.mark.parametrize("size", [(451, 300), (128, 640), (1000, 872)])
def test_an_image_renders_as_vision_start_n_pads_vision_end(processor, size):
    from PIL import Image

    _, proc = processor
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))
    conversation = [
        {"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": "Describe."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "<s_cell>r0c0</s_cell>"}]},
    ]
    text = proc.apply_chat_template(conversation, tokenize=False)
    assert text.startswith("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe.<|im_end|>\n")
    out = proc(text=[text], images=[image], return_tensors="pt")
    t, h, w = out["image_grid_thw"][0].tolist()
    n = t * h * w // 2**2
    # The processor's own resize: multiples of patch x merge = 32 px, within min/max pixels.
    assert h * 16 % 32 == 0 and w * 16 % 32 == 0 and 65536 <= h * w * 256 <= 16777216
    ids = out["input_ids"][0].tolist()
    start = ids.index(VISION_START_TOKEN_ID)
    assert ids[start + 1 : start + 1 + n] == [IMAGE_TOKEN_ID] * n and ids[start + 1 + n] == VISION_END_TOKEN_ID
    assert ids.count(IMAGE_TOKEN_ID) == n and out["pixel_values"].shape[0] == t * h * w


def test_tokenizer_round_trips_text(processor):
    _, proc = processor
    for text in ["<s_cell>r3c1</s_cell><sep/>", "Chelsea the cat, 451 x 300 px: ünïcode ✓\n\tdone", *TEXTS[:20]]:
        ids = proc.tokenizer.encode(text, add_special_tokens=False)
        assert max(ids) < TINY_VOCAB and proc.tokenizer.decode(ids) == text


def test_building_is_deterministic_and_idempotent(tmp_path):
    assert processor_files(TEXTS) == processor_files(list(reversed(TEXTS)))
    folder = build_processor_folder(tmp_path, TEXTS).path
    stamps = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    build_processor_folder(tmp_path, TEXTS)  # same content: nothing rewritten
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == stamps
    (folder / "vocab.json").write_text("{}")
    build_processor_folder(tmp_path, TEXTS)  # a changed file is put back
    assert (folder / "vocab.json").read_bytes() == processor_files(TEXTS)["vocab.json"]
