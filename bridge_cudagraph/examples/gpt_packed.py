"""A GPT SFT set of real text and its tokenizer, built offline, for Bridge's offline sequence packing.

Bridge's GPT fine-tuning recipes can pack SFT samples offline (``GPTSFTDatasetConfig(enable_offline_packing=True)``):
its dataset provider tokenizes ``training.jsonl``/``validation.jsonl`` (``{"input", "output"}`` rows), bins the
samples into rows of ``packed_sequence_size`` tokens, writes them as parquet under ``<dataset_root>/packed/``, and
its ``collate_fn`` hands the step one packed row with ``cu_seqlens_q``/``max_seqlen_q`` (the THD form TE's
attention reads). Their data (SQuAD, ...) needs a download; this module makes the same inputs with nothing fetched:

* the text: the Python standard library's own documentation, ``pydoc_data.topics.topics`` (the texts
  ``help("assert")`` shows; 79 topics in Python 3.12, 28 to 8800 words each). A sample asks about one topic
  (``"Explain the Python topic 'assert'."``) and answers with the start of that topic's text, cut at a word end
  after a number of tokens drawn log-uniformly from :attr:`PydocSftSpec.min_answer_tokens` to
  :attr:`PydocSftSpec.max_answer_tokens` (16..448), so answers run from a title line to several paragraphs with
  code, as SFT answers do, and the packer has long and short pieces to fit together;
* the tokenizer: the byte-level BPE of :mod:`bridge_cudagraph.examples.processor` (Qwen3's pipeline: NFC,
  Qwen's pre-tokenizer regex, 1000 trained tokens, Qwen's special tokens above them; 1020 tokens, under the tiny
  GPT's ``vocab_size`` of :data:`~bridge_cudagraph.examples.tiny.TINY_VOCAB`), trained on all the topic texts and
  questions, written as a Hugging Face folder (``tokenizer.json``, ``tokenizer_config.json``, ``vocab.json``,
  ``merges.txt``, Qwen3's text-model layout) that Bridge loads with
  ``TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=<folder>)``; EOS is ``<|im_end|>``.

Both folders live under the cache (:func:`~bridge_cudagraph.examples.photo_recipe.cache_dir` by default), each
named by a hash of what it is made from (the topic texts, which change with the Python version, the spec, this
module's format), written under a temporary name and renamed into place, and reused when present. Bridge's packer
writes its parquet and metadata into the dataset folder (``packed/<tokenizer name>_pad_seq_to_mult<N>_sft_<hash>``)
and its JSONL index files beside the JSONL, so everything stays in the cache. Validation and test samples are drawn
from the same topics as training (this set is for exercising the data path and the graphs, not for measuring
generalisation).

Tokens per sample at the default :class:`PydocSftSpec` (1024 training samples; ``token_distribution``, or
``python -m bridge_cudagraph.examples.gpt_packed``), min / median / p90 / max: 24 / 90 / 293 / 449 (question,
answer and EOS), 11 / 80 / 282 / 440 (answer and EOS: the loss tokens). Bridge packs them ~3.9 to a row of 512
(260 rows, 98% full; ``cu_seqlens_q`` of 10 entries, ``max_seqlen_q`` 456) and ~7.9 to a row of 1024 (129 rows,
99% full; ``cu_seqlens_q`` of 17). ``max_seqlen_q`` counts the validation split's metadata too: 456 is a
validation sample. Against SQuAD, the set Bridge's Qwen3 SFT recipe reads, the loss share is high: SQuAD's answers
are short spans of a passage (a few words after a paragraph of context), these are paragraphs, as in instruction
sets; packing is what matters for both, since either leaves most of an unpacked row empty.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from bridge_cudagraph.examples.cache import publish_folder, sample_rng

__all__ = [
    "QUESTIONS",
    "SPLITS",
    "TOKENIZER_FILES",
    "GptPackedData",
    "PydocSftSpec",
    "TokenStats",
    "build_gpt_packed_data",
    "build_pydoc_sft_set",
    "build_tokenizer_folder",
    "gpt_packed_dataset_config",
    "packed_microbatches",
    "pydoc_topics",
    "sample_token_counts",
    "token_distribution",
]

#: The JSONL files written, by Bridge's names (``GPTSFTDatasetBuilder.train_path``/``validation_path``/``test_path``).
SPLITS = ("training", "validation", "test")

#: The questions a sample asks about its topic, one drawn per sample.
QUESTIONS = (
    "Explain the Python topic '{topic}'.",
    "What does the Python reference say about '{topic}'?",
    "Describe '{topic}' as the Python documentation does.",
)

#: The tokenizer folder's files (Qwen3's text-model layout on the Hub).
TOKENIZER_FILES = ("merges.txt", "tokenizer.json", "tokenizer_config.json", "vocab.json")

# Bumped when the sample recipe or the folder layout below changes, so an older cached folder is never reused.
_FORMAT = 1


@dataclass(frozen=True)
class PydocSftSpec:
    """What the SFT set is made of; equal specs (and equal topic texts) make byte-identical sets.

    Attributes:
        sizes: Samples per split, in :data:`SPLITS` order.
        seed: Seed of every choice (topic, question, answer length).
        min_answer_tokens, max_answer_tokens: Range of the answer's length in tokens of the tokenizer, drawn
            log-uniformly; the answer is then cut back to the last word end within it (and is the whole topic
            when the topic is shorter). With the question and EOS, the longest sample is about
            ``max_answer_tokens + 20`` tokens: 448 keeps every sample within a packed row of 512.
    """

    sizes: tuple[int, int, int] = (1024, 128, 128)
    seed: int = 1234
    min_answer_tokens: int = 16
    max_answer_tokens: int = 448


class GptPackedData(NamedTuple):
    """What :func:`build_gpt_packed_data` returns; unpacks as ``data_root, tokenizer_folder, tokenizer``.

    Attributes:
        data_root: Bridge's ``dataset_root`` (``training.jsonl``, ``validation.jsonl``, ``test.jsonl``).
        tokenizer_folder: Bridge's ``tokenizer_model`` for ``tokenizer_type="HuggingFaceTokenizer"``.
        tokenizer: That tokenizer, built by Bridge's ``build_tokenizer``; ``tokenizer.vocab_size`` (1020) is what a
            model provider's ``vocab_size`` must hold.
    """

    data_root: Path
    tokenizer_folder: Path
    tokenizer: Any


@dataclass(frozen=True)
class TokenStats:
    """A distribution of tokens per sample (``numpy.percentile``, nearest rank)."""

    count: int
    min: int
    median: int
    p90: int
    max: int

    def __str__(self) -> str:
        return f"{self.min} / {self.median} / {self.p90} / {self.max}"


def pydoc_topics() -> dict[str, str]:
    """The standard library's documentation topics (``pydoc_data.topics.topics``), by name, in name order."""
    from pydoc_data.topics import topics

    return {name: topics[name] for name in sorted(topics)}


def _tokenizer_texts(topics: dict[str, str]) -> list[str]:
    return [*topics.values(), *(q.format(topic=name) for name in topics for q in QUESTIONS)]


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps([_FORMAT, *parts], sort_keys=True).encode()).hexdigest()[:16]


def _tokenizer_key(topics: dict[str, str]) -> str:
    from bridge_cudagraph.examples.processor import content_key

    return _key("pydoc-tokenizer", content_key(_tokenizer_texts(topics)))


def _tokenizer_files(topics: dict[str, str]) -> dict[str, bytes]:
    """The processor module's tokenizer files, without the processor's own (a text model's tokenizer folder)."""
    from bridge_cudagraph.examples.processor import processor_files

    files = processor_files(_tokenizer_texts(topics))
    config = json.loads(files["tokenizer_config.json"])
    config.pop("processor_class", None)  # a text-only folder: AutoProcessor has nothing to find here
    files["tokenizer_config.json"] = (json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
    return {name: files[name] for name in TOKENIZER_FILES}


def build_tokenizer_folder(cache: str | os.PathLike[str] | None = None) -> Path:
    """The tokenizer folder under ``cache``/``pydoc-tokenizer-<key>``: trained once (about a second), then reused."""
    from bridge_cudagraph.examples.photo_recipe import cache_dir

    topics = pydoc_topics()
    target = Path(cache if cache is not None else cache_dir()) / f"pydoc-tokenizer-{_tokenizer_key(topics)}"

    def write(folder: Path) -> None:
        files = _tokenizer_files(topics)
        for name in sorted(files, key=lambda n: n == "tokenizer.json"):  # tokenizer.json last: the marker
            (folder / name).write_bytes(files[name])

    return publish_folder(target, "tokenizer.json", write)


class _Cutter:
    """Cuts a topic's text at the last word end within ``n`` tokens (each topic encoded once)."""

    def __init__(self, tokenizer_json: Path, topics: dict[str, str]):
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(tokenizer_json))
        self._topics = topics
        self._cache: dict[str, tuple[list[int], list[int]]] = {}

    def __call__(self, name: str, n: int) -> str:
        text = self._topics[name].strip()
        if name not in self._cache:
            ends = [end for _, end in self._tokenizer.encode(text, add_special_tokens=False).offsets]
            self._cache[name] = (ends, [m.end() for m in re.finditer(r"\S+", text)])
        token_ends, word_ends = self._cache[name]
        if n >= len(token_ends):
            return text
        i = bisect.bisect_right(word_ends, token_ends[n - 1])  # words ending within the first n tokens
        return text[: word_ends[max(i, 1) - 1]]

    def sample_tokens(self, row: dict[str, str]) -> int:
        """Tokens of ``row`` as Bridge's prompt-completion preprocessing makes them: the prompt, then the
        separator and the answer tokenized together (this tokenizer is space-sensitive), then EOS."""
        encode = self._tokenizer.encode
        return (
            len(encode(row["input"], add_special_tokens=False))
            + len(encode(" " + row["output"], add_special_tokens=False))
            + 1
        )


def _sample(spec: PydocSftSpec, split: str, index: int, names: list[str], cut: _Cutter) -> dict[str, str]:
    rng = sample_rng(spec.seed, split, index)
    name = names[int(rng.integers(len(names)))]
    question = QUESTIONS[int(rng.integers(len(QUESTIONS)))].format(topic=name)
    lo, hi = np.log(spec.min_answer_tokens), np.log(spec.max_answer_tokens)
    n = round(float(np.exp(rng.uniform(lo, hi))))
    return {"input": question, "output": cut(name, n)}


def build_pydoc_sft_set(cache: str | os.PathLike[str] | None = None, spec: PydocSftSpec | None = None) -> Path:
    """The SFT set of ``spec`` under ``cache``/``pydoc-sft-<key>``: built once (well under a second), then reused.

    Each sample is a pure function of ``(spec, split, index)``, the topic texts and the tokenizer (itself a
    function of the topic texts). The folder holds ``training.jsonl``, ``validation.jsonl``, ``test.jsonl``
    (``{"input", "output"}`` per line) and ``spec.json`` (the spec and each split's longest sample in tokens), and
    is Bridge's ``dataset_root``.
    """
    from bridge_cudagraph.examples.photo_recipe import cache_dir

    spec = spec or PydocSftSpec()
    if not 1 <= spec.min_answer_tokens <= spec.max_answer_tokens:
        raise ValueError(f"need 1 <= min_answer_tokens <= max_answer_tokens, got {spec}")
    root = Path(cache if cache is not None else cache_dir())
    tokenizer_folder = build_tokenizer_folder(root)
    topics = pydoc_topics()
    key = _key("pydoc-sft", asdict(spec), tokenizer_folder.name)

    def write(folder: Path) -> None:
        cut = _Cutter(tokenizer_folder / "tokenizer.json", topics)
        names = list(topics)
        longest = {}
        for split, size in zip(SPLITS, spec.sizes, strict=True):
            rows = [_sample(spec, split, i, names, cut) for i in range(size)]
            (folder / f"{split}.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
            longest[split] = max((cut.sample_tokens(r) for r in rows), default=0)
        meta = {"spec": asdict(spec), "tokenizer": tokenizer_folder.name, "format": _FORMAT, "longest": longest}
        (folder / "spec.json").write_text(json.dumps(meta, sort_keys=True) + "\n")

    return publish_folder(root / f"pydoc-sft-{key}", "spec.json", write)


def _preprocessing():
    """Bridge's default for local ``{"input", "output"}`` JSONL (``_default_gpt_sft_preprocessing``), made explicit
    as ``GPTSFTDatasetConfig`` asks new callers to: the prompt, a space, the answer, EOS; loss on the answer only."""
    from megatron.bridge.data.sft_processing import PromptCompletionSFTPreprocessingConfig

    return PromptCompletionSFTPreprocessingConfig(prompt_column="input", completion_column="output", separator=" ")


def sample_token_counts(
    data_root: str | os.PathLike[str], tokenizer: Any, split: str = "training"
) -> list[tuple[int, int]]:
    """``(tokens, answer tokens)`` of every sample of ``split``, tokenized as Bridge's dataset does
    (``tokenize_prompt_completion_example`` with :func:`gpt_packed_dataset_config`'s preprocessing, untruncated):
    ``tokens`` counts the question, the answer and EOS; ``answer tokens`` the answer and EOS (the loss tokens)."""
    from megatron.bridge.data.sft_processing import tokenize_prompt_completion_example

    preprocessing = _preprocessing()
    counts = []
    with open(Path(data_root) / f"{split}.jsonl") as handle:
        for line in handle:
            out = tokenize_prompt_completion_example(json.loads(line), tokenizer, preprocessing)
            counts.append((int(out.input_ids.numel()), int(out.loss_mask.sum())))
    return counts


def _stats(values: list[int]) -> TokenStats:
    median, p90 = np.percentile(values, [50, 90], method="nearest")
    return TokenStats(len(values), int(min(values)), int(median), int(p90), int(max(values)))


def token_distribution(
    data_root: str | os.PathLike[str], tokenizer: Any, split: str = "training"
) -> dict[str, TokenStats]:
    """Tokens per sample of ``split`` (``"sample"``: question + answer + EOS; ``"answer"``: answer + EOS)."""
    counts = sample_token_counts(data_root, tokenizer, split)
    return {"sample": _stats([c[0] for c in counts]), "answer": _stats([c[1] for c in counts])}


def _bridge_tokenizer(tokenizer_folder: Path):
    from megatron.bridge.training.tokenizers.config import TokenizerConfig
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    # Bridge's own builder, as its training setup calls it (``training/setup.py``); a local folder, no Hub access.
    config = TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(tokenizer_folder))
    return build_tokenizer(config)


def build_gpt_packed_data(
    cache: str | os.PathLike[str] | None = None, seq_length: int = 512, *, spec: PydocSftSpec | None = None
) -> GptPackedData:
    """Build (or find) the SFT set and its tokenizer under ``cache``, and load the tokenizer as Bridge does.

    Args:
        cache: Where both folders are built; default :func:`~bridge_cudagraph.examples.photo_recipe.cache_dir`.
        seq_length: The packed row length the set is meant for; every sample must fit in it (Bridge would
            otherwise truncate the question first, then the answer), checked here.
        spec: The set's spec; default :class:`PydocSftSpec`.

    Raises:
        ValueError: A sample is longer than ``seq_length`` tokens.
    """
    spec = spec or PydocSftSpec()
    data_root = build_pydoc_sft_set(cache, spec)
    tokenizer_folder = build_tokenizer_folder(cache)
    longest = max(json.loads((data_root / "spec.json").read_text())["longest"][split] for split in SPLITS[:2])
    if longest > seq_length:
        raise ValueError(
            f"the longest sample has {longest} tokens, more than seq_length {seq_length}: "
            f"lower PydocSftSpec.max_answer_tokens ({spec.max_answer_tokens})"
        )
    return GptPackedData(data_root, tokenizer_folder, _bridge_tokenizer(tokenizer_folder))


def gpt_packed_dataset_config(
    data_root: str | os.PathLike[str],
    tokenizer_folder: str | os.PathLike[str],
    seq_length: int,
    *,
    pad_seq_to_mult: int = 1,
    pad_cu_seqlens: bool = True,
    seed: int = 1234,
):
    """Bridge's ``GPTSFTDatasetConfig`` over the set, packed offline into rows of ``seq_length`` tokens.

    As Bridge's packed perf recipes set it: ``pad_to_max_length`` (every row is ``[1, seq_length]``) and, by
    default, ``pad_cu_seqlens`` (``cu_seqlens_q`` of one length for every row and a constant ``max_seqlen_q``, from
    the packing metadata), the static shapes a CUDA graph replays. ``pad_seq_to_mult`` > 1 pads each sample to a
    multiple (context parallelism's ``2 * cp``) and adds ``cu_seqlens_q_padded``. Bridge requires micro-batch 1
    with offline packing.

    The packed folder is named by ``tokenizer_folder``'s name (content-keyed), so another tokenizer never reuses
    these rows. Test data is never packed by Bridge (an unpacked test batch has other shapes than the graphed
    packed ones), so ``do_test`` is off; ``test.jsonl`` is there for a caller who turns it on.
    """
    from megatron.bridge.data.builders.gpt_sft import GPTSFTDatasetConfig
    from megatron.bridge.data.packing import PackedSequenceSpecs

    return GPTSFTDatasetConfig(
        seq_length=seq_length,
        dataset_root=str(data_root),
        seed=seed,
        preprocessing=_preprocessing(),
        enable_offline_packing=True,
        offline_packing_specs=PackedSequenceSpecs(
            packed_sequence_size=seq_length,
            tokenizer_model_name=Path(tokenizer_folder).name,
            pad_cu_seqlens=pad_cu_seqlens,
            pad_seq_to_mult=pad_seq_to_mult,
        ),
        # Not a field of GPTSFTDatasetConfig: Bridge reads it from dataset_kwargs (build_gpt_sft_split).
        dataset_kwargs={"pad_to_max_length": True},
        do_validation=True,
        do_test=False,
        dataloader_type="batch",
        # In-process, as the photo recipe: the collate is cheap and the step is what is measured.
        num_workers=0,
        persistent_workers=False,
    )


def packed_microbatches(
    count: int,
    seq_length: int,
    cache: str | os.PathLike[str] | None = None,
    pad_seq_to_mult: int = 1,
    *,
    pad_cu_seqlens: bool = True,
    split: str = "training",
    spec: PydocSftSpec | None = None,
) -> list[dict[str, Any]]:
    """``count`` micro-batches of one packed row each, made on the CPU by Bridge's dataset provider and collate.

    Bridge's ``get_dataset_provider(config)`` packs the set (once; the parquet is reused) and returns the packed
    datasets; row ``i % len(dataset)`` is collated alone, as the training loop's micro-batch 1 split of a
    ``dataloader_type="batch"`` global batch gives it (with ``pad_cu_seqlens`` the two are identical).

    Returns:
        Dicts with ``tokens``, ``labels``, ``loss_mask``, ``position_ids`` (int64 ``[1, seq_length]``),
        ``cu_seqlens_q``/``cu_seqlens_kv`` (int32 ``[1, K]``), ``max_seqlen_q``/``max_seqlen_kv`` (int32), the
        ``*_padded`` pair when ``pad_seq_to_mult`` > 1, ``token_count`` and ``attention_mask`` (None).
    """
    from megatron.bridge.data.utils import get_dataset_provider

    if split not in SPLITS[:2]:
        raise ValueError(f"split must be 'training' or 'validation' (Bridge packs only those), got {split!r}")
    data_root, tokenizer_folder, tokenizer = build_gpt_packed_data(cache, seq_length, spec=spec)
    config = gpt_packed_dataset_config(
        data_root, tokenizer_folder, seq_length, pad_seq_to_mult=pad_seq_to_mult, pad_cu_seqlens=pad_cu_seqlens
    )
    config.finalize()
    train, valid, _ = get_dataset_provider(config)([count, count, 0], config, tokenizer=tokenizer)
    dataset = train if split == "training" else valid
    return [dataset.collate_fn([dataset[i % len(dataset)]]) for i in range(count)]


def main() -> None:
    """Print the set's tokens per sample (``python -m bridge_cudagraph.examples.gpt_packed``), for the README."""
    data_root, _, tokenizer = build_gpt_packed_data()
    print(f"{data_root} (vocab {tokenizer.vocab_size})")
    for split in SPLITS:
        for part, stats in token_distribution(data_root, tokenizer, split).items():
            print(f"{split:10s} {part:6s} n={stats.count:5d}  min / median / p90 / max = {stats}")


if __name__ == "__main__":
    main()
