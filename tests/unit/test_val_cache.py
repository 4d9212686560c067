"""Validation batches read once and kept on the device (train/val_cache.py): same metrics as reading every pass."""

from __future__ import annotations

import torch

from draftlab.util.reporting import RecordingReporter
from draftlab.train.loop import Trainer
from draftlab.train.val_cache import ValidationCache
from test_train_loop import FakeSource, _model, _settings


class CountingSource(FakeSource):
    def __init__(self) -> None:
        super().__init__()
        self.reads = {"train": 0, "val": 0}

    def batches(self, split, *args, **kwargs):
        self.reads[split] += 1
        return super().batches(split, *args, **kwargs)


def _trainer(tmp_path, name: str, limit: int) -> tuple[Trainer, CountingSource]:
    source = CountingSource()
    trainer = Trainer(_model(source), source, source.lm_head, _settings(checkpoint_every=10_000), tmp_path / name,
                      RecordingReporter())
    trainer._val_cache = ValidationCache(torch.device("cpu"), limit_bytes=limit)  # the GPU's policy, on the CPU
    return trainer, source


def _train_one_step(trainer: Trainer) -> None:
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    trainer.state["total_steps"] = trainer.state["stop_at"] = 10
    trainer._train_step(next(iter(trainer.source.batches("train", 0, 200, 64, 0, True))), 0, params)


def test_a_kept_split_is_read_once_and_gives_the_metrics_of_a_fresh_read(tmp_path):
    kept, kept_source = _trainer(tmp_path, "kept", limit=1 << 30)
    fresh, fresh_source = _trainer(tmp_path, "fresh", limit=0)
    assert kept.evaluate() == fresh.evaluate()
    for trainer in (kept, fresh):
        _train_one_step(trainer)
    after = kept.evaluate()
    assert after == fresh.evaluate()  # the kept batches are inputs, not results: new weights, new metrics
    assert kept_source.reads["val"] == 1 and fresh_source.reads["val"] == 2


def test_a_split_over_the_limit_is_read_every_pass(tmp_path):
    trainer, source = _trainer(tmp_path, "small", limit=1000)  # under one batch's bytes: the split does not fit
    first = trainer.evaluate()
    assert trainer.evaluate() == first and source.reads["val"] == 2 and not trainer._val_cache.kept


def test_a_pass_stopped_early_keeps_nothing():
    cache = ValidationCache(torch.device("cpu"), limit_bytes=1 << 20)
    items = [({"x": torch.zeros(4)}, None) for _ in range(3)]
    passes = cache.passes("val", lambda: iter(items))
    next(passes)
    passes.close()
    assert not cache.kept
    assert [i for i, _ in zip(cache.passes("val", lambda: iter(items)), range(5))] == items and "val" in cache.kept
    assert ValidationCache(torch.device("cpu")).limit == 0  # the CPU reads every pass
