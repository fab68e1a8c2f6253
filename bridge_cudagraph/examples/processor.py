# ruff: noqa: E501  (the chat template and the regex are public text, reproduced verbatim)
"""A Qwen3-VL processor folder built offline: Qwen3-VL's image/video processor settings and chat template, and a
small tokenizer trained in-process with the ``tokenizers`` package.

Bridge's Qwen3-VL fine-tuning data path (``DirectHFSFTDatasetConfig``, ``MockVLMSFTDatasetConfig``) calls
``AutoProcessor.from_pretrained(hf_processor_path)`` and then its own Qwen-VL collate, which needs a real
``Qwen3VLProcessor``. The real one comes from the Hub (151k-token vocabulary, far beyond a tiny model's embedding
table); this module writes a folder of the same layout as the Hub snapshot (``preprocessor_config.json``,
``video_preprocessor_config.json``, ``chat_template.json``, ``tokenizer.json``/``vocab.json``/``merges.txt``,
``tokenizer_config.json``), so every transformers version that loads the Hub folder loads this one.

What is Qwen3-VL's own, unchanged:

* the image and video processor settings of Qwen3-VL-8B-Instruct (patch 16, temporal patch 2, merge 2, mean/std
  0.5, ``size`` = min/max pixels 65536/16777216 for images and 4096/25165824 for videos);
* the chat template, :data:`QWEN3_VL_CHAT_TEMPLATE`, byte for byte Qwen3-VL-8B-Instruct's ``chat_template.json``
  (5292 bytes, sha256 ``3636d0f0...``; a test pins both);
* the special tokens and the tokenizer pipeline of Qwen2/Qwen3 (NFC, Qwen's pre-tokenizer regex, byte-level BPE).

What is ours: the vocabulary. A byte-level BPE of :data:`BASE_VOCAB` tokens is trained on the dataset's text, and
the special tokens follow at fixed ids chosen to be the tiny provider's (``image_token_id`` 1000,
``video_token_id`` 1001, ``vision_start_token_id`` 1002, ``vision_end_token_id`` 1003), so the processor's ids are
the ones the model is built with; :class:`ProcessorFolder` returns them too, for a recipe that sets them on
another provider.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from bridge_cudagraph.examples.tiny import (
    IMAGE_TOKEN_ID,
    TINY_VOCAB,
    VIDEO_TOKEN_ID,
    VISION_END_TOKEN_ID,
    VISION_START_TOKEN_ID,
)

__all__ = [
    "BASE_VOCAB",
    "IMAGE_PROCESSOR_CONFIG",
    "QWEN3_VL_CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "VIDEO_PROCESSOR_CONFIG",
    "ProcessorFolder",
    "build_processor_folder",
    "content_key",
    "processor_files",
]

#: Qwen3-VL-8B-Instruct's ``chat_template.json`` template, unchanged (public; 5292 bytes).
QWEN3_VL_CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' }}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- for message in messages %}
    {%- if message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content_item in message.content %}
                {%- if 'text' in content_item %}
                    {{- content_item.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and message.content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

_MEAN_STD = [0.5, 0.5, 0.5]

#: Qwen3-VL-8B-Instruct's ``preprocessor_config.json``: min/max pixels 256x256 and 4096x4096.
IMAGE_PROCESSOR_CONFIG: dict = {
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": _MEAN_STD,
    "image_std": _MEAN_STD,
    "processor_class": "Qwen3VLProcessor",
    "image_processor_type": "Qwen2VLImageProcessorFast",
}

#: Qwen3-VL-8B-Instruct's ``video_preprocessor_config.json`` (``Qwen3VLProcessor`` needs a video processor).
VIDEO_PROCESSOR_CONFIG: dict = {
    "size": {"longest_edge": 25165824, "shortest_edge": 4096},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": _MEAN_STD,
    "image_std": _MEAN_STD,
    "processor_class": "Qwen3VLProcessor",
    "video_processor_type": "Qwen3VLVideoProcessor",
}

#: Trained byte-level BPE tokens (ids ``0 .. BASE_VOCAB - 1``); the special tokens follow.
BASE_VOCAB = min(IMAGE_TOKEN_ID, VIDEO_TOKEN_ID, VISION_START_TOKEN_ID, VISION_END_TOKEN_ID)

#: Qwen3-VL's special tokens with their ids here: the four vision tokens at the tiny provider's ids, then the rest
#: of Qwen's added tokens in Qwen's order. All are below the provider's ``vocab_size`` (:data:`TINY_VOCAB`).
SPECIAL_TOKENS: dict[str, int] = {
    "<|image_pad|>": IMAGE_TOKEN_ID,
    "<|video_pad|>": VIDEO_TOKEN_ID,
    "<|vision_start|>": VISION_START_TOKEN_ID,
    "<|vision_end|>": VISION_END_TOKEN_ID,
    **{
        token: BASE_VOCAB + 4 + i
        for i, token in enumerate(
            (
                "<|endoftext|>",
                "<|im_start|>",
                "<|im_end|>",
                "<|object_ref_start|>",
                "<|object_ref_end|>",
                "<|box_start|>",
                "<|box_end|>",
                "<|quad_start|>",
                "<|quad_end|>",
                "<|vision_pad|>",
            )
        )
    },
}
# Qwen's template writes these as text; Qwen's vocabulary has them as added, non-special tokens.
_PLAIN_ADDED = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
_PLAIN_IDS = {token: BASE_VOCAB + len(SPECIAL_TOKENS) + i for i, token in enumerate(_PLAIN_ADDED)}

# Qwen2/Qwen3's pre-tokenizer (transformers' tokenization_qwen2.PRETOKENIZE_REGEX).
_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


@dataclass(frozen=True)
class ProcessorFolder:
    """A built processor folder and the token ids the model provider must be built with.

    Attributes:
        path: The folder; ``AutoProcessor.from_pretrained(path)`` loads a ``Qwen3VLProcessor``.
        image_token_id, video_token_id, vision_start_token_id, vision_end_token_id: The provider's fields of
            the same names must equal these (Qwen3-VL's mRoPE and the image-feature scatter read them).
        pad_token_id: ``<|endoftext|>``, Qwen's pad token.
        vocab_size: Tokens in the tokenizer (the provider's ``vocab_size`` must be at least this).
    """

    path: Path
    image_token_id: int
    video_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int
    pad_token_id: int
    vocab_size: int


def _train_tokenizer(texts: Iterable[str]):
    """A byte-level BPE of exactly :data:`BASE_VOCAB` tokens on ``texts``, then the added tokens at their ids."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BASE_VOCAB,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tokenizer.train_from_iterator(sorted(set(texts)), trainer=trainer)
    # A small corpus may run out of merges: fill the rest so the special tokens keep their fixed ids.
    fillers = [f"<|reserved_{i}|>" for i in range(BASE_VOCAB - tokenizer.get_vocab_size(with_added_tokens=True))]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in fillers])
    ordered = sorted([*SPECIAL_TOKENS.items(), *_PLAIN_IDS.items()], key=lambda item: item[1])
    for token, wanted in ordered:
        special = token in SPECIAL_TOKENS
        tokenizer.add_special_tokens([AddedToken(token, special=special, normalized=False)])
        if tokenizer.token_to_id(token) != wanted:
            raise RuntimeError(f"tokenizer: {token} got id {tokenizer.token_to_id(token)}, wanted {wanted}")
    return tokenizer


def _json(obj) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def processor_files(texts: Iterable[str]) -> dict[str, bytes]:
    """Every file of the processor folder, by name, as bytes (pure: the same ``texts`` give the same bytes)."""
    tokenizer = _train_tokenizer(texts)
    model = json.loads(tokenizer.to_str())["model"]
    decoder = tokenizer.get_added_tokens_decoder()
    added = {
        str(token_id): {
            "content": decoder[token_id].content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": decoder[token_id].content not in _PLAIN_IDS,
        }
        for token_id in sorted(decoder)
    }
    tokenizer_config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 262144,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
        "processor_class": "Qwen3VLProcessor",
    }
    merges = model["merges"]
    merges_txt = "#version: 0.2\n" + "".join(f"{' '.join(m) if isinstance(m, list) else m}\n" for m in merges)
    return {
        "chat_template.json": _json({"chat_template": QWEN3_VL_CHAT_TEMPLATE}),
        "merges.txt": merges_txt.encode(),
        "preprocessor_config.json": _json(IMAGE_PROCESSOR_CONFIG),
        "tokenizer.json": tokenizer.to_str(pretty=True).encode() + b"\n",
        "tokenizer_config.json": _json(tokenizer_config),
        "video_preprocessor_config.json": _json(VIDEO_PROCESSOR_CONFIG),
        "vocab.json": _json(model["vocab"]),
    }


def build_processor_folder(folder: str | os.PathLike[str], texts: Iterable[str]) -> ProcessorFolder:
    """Write the processor folder for ``texts`` into ``folder`` (created if absent); a no-op when it holds it already.

    Each file is compared byte for byte and replaced atomically only when it differs, so concurrent builders of
    the same content (every rank of a run) never see a half-written file. Files of other names are left alone.

    Args:
        folder: Where to write.
        texts: The text the tokenizer is trained on (the dataset's prompts and answers).

    Returns:
        The folder and the token ids the model must use.
    """
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    for name, content in processor_files(texts).items():
        target = path / name
        if target.is_file() and target.read_bytes() == content:
            continue
        fd, tmp = tempfile.mkstemp(dir=path, prefix=f".{name}.")
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
        os.replace(tmp, target)
    ids = SPECIAL_TOKENS
    vocab_size = BASE_VOCAB + len(SPECIAL_TOKENS) + len(_PLAIN_IDS)
    if vocab_size > TINY_VOCAB:  # the tiny model's embedding table must hold every id
        raise ValueError(f"the processor has {vocab_size} tokens, more than the tiny vocabulary {TINY_VOCAB}")
    return ProcessorFolder(
        path=path,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        vocab_size=vocab_size,
    )


def content_key(texts: Iterable[str]) -> str:
    """A short hash of what the folder is built from (the texts and this module's settings), for cache folders."""
    digest = hashlib.sha256()
    for part in (QWEN3_VL_CHAT_TEMPLATE, json.dumps([IMAGE_PROCESSOR_CONFIG, VIDEO_PROCESSOR_CONFIG, SPECIAL_TOKENS])):
        digest.update(part.encode())
    for text in sorted(set(texts)):
        digest.update(text.encode() + b"\0")
    return digest.hexdigest()[:16]
