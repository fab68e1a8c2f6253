"""The GPT SFT set of pydoc texts and its tokenizer, packed offline by Bridge's own dataset provider on the CPU."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bridge_cudagraph.examples.gpt_packed import (
    QUESTIONS,
    SPLITS,
    TOKENIZER_FILES,
    PydocSftSpec,
    build_gpt_packed_data,
    build_pydoc_sft_set,
    build_tokenizer_folder,
    gpt_packed_dataset_config,
    packed_microbatches,
    pydoc_topics,
    sample_token_counts,
    token_distribution,
)
from bridge_cudagraph.examples.tiny import TINY_VOCAB

SEQ = 512
SMALL = PydocSftSpec(sizes=(48, 8, 8))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The default set, its tokenizer and the cache they are in (packed by the tests below into the same cache)."""
    cache = tmp_path_factory.mktemp("gpt_packed")
    return cache, build_gpt_packed_data(cache, SEQ)


def _rows(data_root, split="training"):
    return [json.loads(line) for line in (data_root / f"{split}.jsonl").read_text().splitlines()]


def test_set_is_built_offline_deterministically_and_reused(tmp_path):
    a = build_pydoc_sft_set(tmp_path / "a", SMALL)
    b = build_pydoc_sft_set(tmp_path / "b", SMALL)
    assert a.name == b.name and a.name.startswith("pydoc-sft-")
    for split in SPLITS:
        assert (a / f"{split}.jsonl").read_bytes() == (b / f"{split}.jsonl").read_bytes()
    assert [len(_rows(a, s)) for s in SPLITS] == list(SMALL.sizes)
    tokenizers = [build_tokenizer_folder(tmp_path / d) for d in "ab"]
    for name in TOKENIZER_FILES:
        assert (tokenizers[0] / name).read_bytes() == (tokenizers[1] / name).read_bytes()
    # A second call finds both folders and writes nothing.
    stamps = {p: p.stat().st_mtime_ns for p in [*a.iterdir(), *tokenizers[0].iterdir()]}
    assert build_pydoc_sft_set(tmp_path / "a", SMALL) == a
    assert {p: p.stat().st_mtime_ns for p in [*a.iterdir(), *tokenizers[0].iterdir()]} == stamps
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted([a.name, tokenizers[0].name])
    # Another spec is another folder, with other samples.
    other = build_pydoc_sft_set(tmp_path / "a", PydocSftSpec(sizes=(48, 8, 8), seed=7))
    assert other != a and _rows(other) != _rows(a)


def test_samples_are_real_pydoc_texts_cut_at_word_ends(built):
    _, (data_root, _, _) = built
    topics = pydoc_topics()
    asked = {q.format(topic=name): name for name in topics for q in QUESTIONS}
    seen = set()
    for split in SPLITS:
        for row in _rows(data_root, split):
            assert set(row) == {"input", "output"}
            name = asked[row["input"]]  # a question naming a real topic
            text = topics[name].strip()
            answer = row["output"]
            assert answer and text.startswith(answer), (name, answer[:80])
            assert len(answer) == len(text) or text[len(answer)].isspace()  # a word end, not mid-word
            seen.add(name)
    assert len(seen) > 0.9 * len(topics)  # the draws cover the topics
    assert topics["assert"].startswith('The "assert" statement')  # the standard library's own text


def test_token_distribution_is_varied_and_is_what_bridge_packs(built):
    cache, (data_root, tokenizer_folder, tokenizer) = built
    stats = token_distribution(data_root, tokenizer)
    sample, answer = stats["sample"], stats["answer"]
    assert sample.count == answer.count == PydocSftSpec().sizes[0]
    assert answer.min <= 24 and answer.max >= 400 and 50 <= answer.median <= 150 and answer.p90 >= 200
    assert sample.min < sample.median < sample.p90 < sample.max <= SEQ
    counts = sample_token_counts(data_root, tokenizer)
    spec_json = json.loads((data_root / "spec.json").read_text())
    assert spec_json["longest"]["training"] == max(c[0] for c in counts)
    # Bridge's provider, called as its training setup calls it, packs exactly these samples.
    from megatron.bridge.data.utils import get_dataset_provider

    config = gpt_packed_dataset_config(data_root, tokenizer_folder, SEQ)
    config.finalize()
    train, valid, test = get_dataset_provider(config)([8, 8, 0], config, tokenizer=tokenizer)
    assert type(train).__name__ == "GPTSFTPackedParquetDataset" and len(valid) > 0 and test is None
    lengths = sorted(int(n) for i in range(len(train)) for n in np.diff(train[i]["seq_boundaries"]))
    assert lengths == sorted(c[0] for c in counts)
    loss = sum(int(train.collate_fn([train[i]])["loss_mask"].sum()) for i in range(len(train)))
    assert loss == sum(c[1] for c in counts)  # loss on every answer token and EOS, none on the questions
    packed = data_root / "packed"
    assert packed.is_dir() and (cache / data_root.name) == data_root  # Bridge wrote inside the cache


def test_tokenizer_loads_in_bridge_and_fits_the_tiny_gpt(built):
    _, (_, tokenizer_folder, tokenizer) = built
    assert sorted(p.name for p in tokenizer_folder.iterdir()) == sorted(TOKENIZER_FILES)
    assert "processor_class" not in json.loads((tokenizer_folder / "tokenizer_config.json").read_text())
    assert type(tokenizer._tokenizer).__name__ == "HuggingFaceTokenizer"
    assert tokenizer.vocab_size <= TINY_VOCAB
    vocab = tokenizer.vocab  # tokens by id (Bridge's wrapper needs ids 0 .. vocab_size - 1 with no gaps)
    assert len(vocab) == tokenizer.vocab_size and tokenizer.eos_id == tokenizer.eod == vocab.index("<|im_end|>")
    text = pydoc_topics()["for"]
    ids = tokenizer.tokenize(text)
    assert max(ids) < tokenizer.vocab_size and tokenizer.detokenize(ids) == text
    assert len(ids) < len(text) / 2.5  # trained on these texts: several characters per token


def _check_static(batches, vocab_size, seq):
    ks = {tuple(b["cu_seqlens_q"].shape) for b in batches}
    assert len(ks) == 1 and ks.pop()[0] == 1
    assert len({int(b["max_seqlen_q"]) for b in batches}) == 1
    for b in batches:
        for key in ("tokens", "labels", "loss_mask", "position_ids"):
            assert b[key].shape == (1, seq), key
        assert int(b["tokens"].max()) < vocab_size and int(b["labels"].max()) < vocab_size
        assert int(b["tokens"].min()) >= 0 and int(b["loss_mask"].sum()) > 0
        assert b["cu_seqlens_kv"] is b["cu_seqlens_q"] and b["attention_mask"] is None
        assert b["max_seqlen_q"].shape == (1,)


def test_bridge_packs_rows_of_static_shape(built):
    cache, (_, _, tokenizer) = built
    batches = packed_microbatches(300, SEQ, cache)  # more than the rows: cycles
    assert len(batches) == 300
    _check_static(batches, tokenizer.vocab_size, SEQ)
    assert "cu_seqlens_q_padded" not in batches[0]
    max_seqlen = int(batches[0]["max_seqlen_q"])
    for b in batches:
        cu = b["cu_seqlens_q"][0]
        assert cu.dtype.is_signed and int(cu[0]) == 0 and int(cu[-1]) == SEQ
        assert bool((cu[1:] >= cu[:-1]).all())
        segments = (cu[1:] - cu[:-1]).tolist()
        assert max(segments) <= max_seqlen
        # Positions restart at every segment; the last one may be the row's padding (positions 0, no loss).
        pos, loss = b["position_ids"][0], b["loss_mask"][0]
        spans = [(s, n) for s, n in zip(cu[:-1].tolist(), segments, strict=True) if n]
        for i, (start, length) in enumerate(spans):
            if pos[start : start + length].tolist() != list(range(length)):
                assert i == len(spans) - 1 and not pos[start:].any() and not loss[start:].any()
    assert sum(len(set(b["cu_seqlens_q"][0].tolist())) > 3 for b in batches) > len(batches) / 2  # real packing


def test_pad_seq_to_mult_adds_padded_boundaries(built):
    cache, (_, _, tokenizer) = built
    batches = packed_microbatches(64, SEQ, cache, pad_seq_to_mult=8)
    _check_static(batches, tokenizer.vocab_size, SEQ)
    for b in batches:
        q, padded = b["cu_seqlens_q"][0], b["cu_seqlens_q_padded"][0]
        assert b["cu_seqlens_kv_padded"] is b["cu_seqlens_q_padded"] and padded.shape == q.shape
        assert int(padded[0]) == 0 and int(padded[-1]) == SEQ and bool((padded[1:] >= padded[:-1]).all())
        assert bool(((padded[1:] - padded[:-1]) % 8 == 0).all())  # every physical segment a multiple of 8
        assert bool((q <= padded).all()) and bool((q[1:] >= q[:-1]).all()) and int(q[-1]) < SEQ


def test_dataset_config_is_bridges_offline_packing(built):
    _, (data_root, tokenizer_folder, _) = built
    config = gpt_packed_dataset_config(data_root, tokenizer_folder, 1024, pad_seq_to_mult=4, seed=5)
    specs = config.offline_packing_specs
    assert type(config).__name__ == "GPTSFTDatasetConfig" and config.enable_offline_packing
    assert (specs.packed_sequence_size, specs.pad_cu_seqlens, specs.pad_seq_to_mult) == (1024, True, 4)
    assert specs.tokenizer_model_name == tokenizer_folder.name
    assert config.dataset_kwargs == {"pad_to_max_length": True} and config.num_workers == 0
    assert config.seq_length == 1024 and config.seed == 5 and config.dataset_root == str(data_root)
    config.finalize()  # Bridge's own validation
    assert not gpt_packed_dataset_config(
        data_root, tokenizer_folder, 512, pad_cu_seqlens=False
    ).offline_packing_specs.pad_cu_seqlens


def test_a_sample_longer_than_the_row_is_refused(built):
    cache, _ = built
    with pytest.raises(ValueError, match="longest sample"):
        build_gpt_packed_data(cache, 256)
