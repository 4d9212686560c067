"""The training batches' plan (data/reader.plan_batches, train.plan_window): every sample once per epoch, within the
token budget, the same for the same seed and epoch; larger windows give fuller batches."""

from __future__ import annotations

import random

import pytest

from draftlab.config.config import ConfigError, validate
from draftlab.data.features import Entry
from draftlab.data.reader import PLAN_WINDOW, FeatureSource, plan_batches

BUDGET = 16_384


def _lengths(n: int = 3000, seed: int = 0) -> list[int]:
    rng = random.Random(seed)  # ShareGPT-like: a prompt and up to 128 answer tokens, a few long ones
    return [rng.randint(40, 520) if rng.random() < 0.97 else rng.randint(520, 2048) for _ in range(n)]


def _fill(lengths: list[int], plan: list[list[int]]) -> float:
    """Real tokens a batch, as a share of the budget, on average."""
    return sum(lengths) / len(plan) / BUDGET


@pytest.mark.parametrize("window", [PLAN_WINDOW, 2048])
def test_a_plan_takes_every_sample_once_within_the_budget_and_repeats(window):
    lengths = _lengths()
    plan = plan_batches(lengths, BUDGET, seed=3, epoch=1, shuffle=True, window_size=window)
    assert sorted(i for batch in plan for i in batch) == list(range(len(lengths)))
    assert all(max(lengths[i] for i in b) * len(b) <= BUDGET for b in plan)
    assert plan == plan_batches(lengths, BUDGET, seed=3, epoch=1, shuffle=True, window_size=window)
    assert plan != plan_batches(lengths, BUDGET, seed=3, epoch=2, shuffle=True, window_size=window)


def test_larger_windows_fill_the_batches():
    lengths = _lengths()
    fills = [_fill(lengths, plan_batches(lengths, BUDGET, 0, 0, True, window_size=w)) for w in (64, PLAN_WINDOW, 2048)]
    assert fills[0] < fills[1] < fills[2] and fills[2] > 0.9, fills


def test_the_source_plans_with_train_plan_window(tiny_cfg):
    entries = [Entry(i, "train", length, 0, 0) for i, length in enumerate(_lengths(600))]
    narrow = FeatureSource({}, entries, None, len(entries), 64, plan_window=16)
    wide = FeatureSource({}, entries, None, len(entries), 64, plan_window=600)
    assert wide.num_batches("train", 0, BUDGET, 2048, 0) < narrow.num_batches("train", 0, BUDGET, 2048, 0)
    with pytest.raises(ConfigError, match="train.plan_window"):
        validate(tiny_cfg("train.plan_window=0"))


def test_the_validation_plan_groups_samples_by_length():
    """Unshuffled (validation): every sample once, within the budget, longest first, whatever the seed and epoch;
    padded to little more than its tokens, where index order padded the same lengths to about twice theirs."""
    lengths = _lengths()
    plan = plan_batches(lengths, BUDGET, seed=0, epoch=0, shuffle=False)
    assert sorted(i for batch in plan for i in batch) == list(range(len(lengths)))
    assert all(max(lengths[i] for i in b) * len(b) <= BUDGET for b in plan)
    assert plan == plan_batches(lengths, BUDGET, seed=5, epoch=3, shuffle=False)
    widths = [max(lengths[i] for i in b) for b in plan]
    assert widths == sorted(widths, reverse=True)
    padded = sum(len(b) * width for b, width in zip(plan, widths))
    in_order, batch, width = 0, [], 0  # index order, cut at the same budget: what the plan was before
    for length in lengths:
        if batch and max(width, length) * (len(batch) + 1) > BUDGET:
            in_order, batch, width = in_order + len(batch) * width, [], 0
        batch, width = batch + [length], max(width, length)
    in_order += len(batch) * width
    assert padded < 1.1 * sum(lengths) < in_order / 1.5, (padded, sum(lengths), in_order)
