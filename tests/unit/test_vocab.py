"""The draft vocabulary: most frequent training assistant tokens, SGLang's d2t offsets, SpecForge's t2d mask."""

import pytest
import torch

from draftlab.config.config import ConfigError
from draftlab.data.samples import Sample
from draftlab.data.vocab import (build_vocab, count_tokens, coverage, draft_to_target, read_vocab, vocab_path,
                                 write_vocab)


def sample(index, ids, mask, split="train"):
    return Sample(index, torch.tensor(ids), torch.tensor(mask, dtype=torch.bool), split)


def test_counts_only_training_assistant_tokens():
    samples = [sample(0, [1, 2, 3, 3], [0, 0, 1, 1]),
               sample(1, [4, 4, 5], [0, 1, 1], split="val"),  # validation never shapes the vocab
               sample(2, [3, 6, 2], [1, 1, 0])]
    counts = count_tokens(samples, 8)
    assert counts.tolist() == [0, 0, 0, 3, 0, 0, 1, 0]


def test_counts_in_chunks_equal_one_pass():
    gen = torch.Generator().manual_seed(0)
    samples = [sample(i, torch.randint(0, 50, (20,), generator=gen).tolist(), [i % 3 != 0] * 20,
                      split="val" if i % 5 == 0 else "train") for i in range(40)]
    expected = torch.zeros(50, dtype=torch.int64)
    for s in samples:
        if s.split == "train":
            for t in s.input_ids[s.loss_mask]:
                expected[t] += 1
    assert expected.sum() > 0
    for chunk in (1, 7, 10_000):  # a flush after every sample, mid-way, and only at the end
        assert torch.equal(count_tokens(samples, 50, chunk_tokens=chunk), expected)


def test_most_frequent_sorted_ascending_with_offsets():
    counts = torch.tensor([0, 5, 0, 9, 1, 7, 0, 2])
    d2t, t2d, selected = build_vocab(counts, 3)
    assert selected.tolist() == [1, 3, 5]
    assert d2t.dtype == torch.int64 and d2t.tolist() == [1, 2, 3]  # target = draft + d2t[draft]
    assert draft_to_target(d2t).tolist() == [1, 3, 5]
    assert t2d.dtype == torch.bool and t2d.nonzero().flatten().tolist() == [1, 3, 5]


def test_ties_and_padding_are_deterministic():
    counts = torch.tensor([0, 4, 0, 4, 4, 0, 0, 0])
    assert build_vocab(counts, 2)[2].tolist() == [1, 3]  # equal counts: lower id first
    # Only 3 distinct tokens for 5 slots: padded with the smallest unused ids.
    assert build_vocab(counts, 5)[2].tolist() == [0, 1, 2, 3, 4]


def test_full_vocab_is_identity():
    d2t, t2d, _ = build_vocab(torch.arange(6), 6)
    assert d2t.tolist() == [0] * 6 and bool(t2d.all())


def test_too_large_names_the_key():
    with pytest.raises(ConfigError, match=r"^draft\.vocab_size: 9 exceeds the target vocabulary \(8"):
        build_vocab(torch.zeros(8, dtype=torch.int64), 9)


def test_coverage_and_file_roundtrip(tmp_path):
    counts = torch.tensor([10, 0, 5, 5, 0])
    path = vocab_path(tmp_path, 200, 2)
    assert path == tmp_path / "vocab" / "n200-v2.safetensors"
    cov = write_vocab(path, counts, 2)
    assert cov == pytest.approx(15 / 20)
    stored = read_vocab(path)
    assert set(stored) == {"d2t", "t2d", "counts"}
    assert torch.equal(stored["counts"], counts) and coverage(counts, stored["t2d"]) == cov
    assert draft_to_target(stored["d2t"]).tolist() == [0, 2]


def test_missing_vocab_says_what_to_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="extract stage"):
        read_vocab(vocab_path(tmp_path, 1, 1))
