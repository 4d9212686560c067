"""What the training loop says while it runs: the share of time spent waiting for batches, and each validation
pass in the log (a job killed before it writes results.json still shows its curve there)."""

from __future__ import annotations

import logging
import types

import pytest

from draftlab.reporting import RecordingReporter
from draftlab.train import loop
from draftlab.train.loop import Trainer
from test_train_loop import FakeSource, _model, _settings


class Clock:
    """A fake perf_counter: time moves only when the test says so, so the measured shares are exact."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class SlowSource(FakeSource):
    """Each training batch takes `read_s` (fake) seconds to arrive."""

    def __init__(self, clock: Clock, read_s: float) -> None:
        super().__init__()
        self.clock, self.read_s = clock, read_s

    def batches(self, split, *args):
        for batch in super().batches(split, *args):
            if split == "train":
                self.clock.now += self.read_s
            yield batch


def test_data_wait_share_is_the_time_spent_waiting_for_batches(tmp_path, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    source = SlowSource(clock, read_s=3.0)
    rep = RecordingReporter()

    trainer = Trainer(_model(source), source, source.lm_head, _settings(epochs=1, log_every=2), tmp_path / "ckpt",
                      rep)
    step = trainer._train_step

    def computing_step(*args):  # each step "computes" for 1 s after its 3 s wait
        step(*args)
        clock.now += 1.0

    monkeypatch.setattr(trainer, "_train_step", computing_step)
    trainer.run()
    shares = [values["train/data_wait_frac"] for _, values in rep.history if "train/data_wait_frac" in values]
    assert shares and all(share == pytest.approx(0.75) for share in shares), shares


def test_each_validation_pass_is_logged_with_the_best_so_far(tmp_path, caplog):
    source = FakeSource()
    trainer = Trainer(_model(source), source, source.lm_head, _settings(epochs=3, eval_every=2, log_every=2),
                      tmp_path / "ckpt", RecordingReporter())
    with caplog.at_level(logging.INFO, logger="draftlab"):
        result = trainer.run()
    lines = [r.getMessage() for r in caplog.records if " val/loss " in r.getMessage()]
    assert len(lines) == len(result.history) >= 3
    for k, (line, entry) in enumerate(zip(lines, result.history)):
        assert line.startswith(f"train: step {int(entry['step'])} val/loss {entry['val/loss']:.4f} ")
        if k == 0:
            assert line.endswith("(best so far -)")
        else:  # the best of the passes before this one
            best = min(result.history[:k], key=lambda e: e["val/loss"])
            assert line.endswith(f"(best so far {best['val/loss']:.4f} at step {int(best['step'])})"), line
