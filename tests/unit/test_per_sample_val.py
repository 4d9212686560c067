"""Per-sample validation results: each held-out sample's loss and predicted tau, which the sweep analysis
bootstraps over; their token-weighted means give back the validation pass's own numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from draftlab.util.reporting import RecordingReporter
from draftlab.train.loop import Trainer
from draftlab.train.per_sample import per_sample_validation
from test_train_loop import FakeSource, _model, _settings


class IndexedSource(FakeSource):
    """FakeSource with the sample indices the real FeatureSource puts in every batch."""

    def batches(self, split, epoch, batch_tokens, max_seq_len, seed, shuffle, prepare=None):
        first = 1000 if split == "val" else 0
        offsets = iter(range(first, first + 10_000))
        for batch in super().batches(split, epoch, batch_tokens, max_seq_len, seed, shuffle):
            batch["sample_index"] = torch.tensor([next(offsets) for _ in range(batch["input_ids"].shape[0])])
            yield prepare(batch) if prepare else batch


def test_per_sample_results_add_up_to_the_validation_pass(tmp_path):
    source = IndexedSource(n_train=24, n_val=12)
    s = _settings(max_steps=6, epochs=None, batch_tokens=100, num_steps=1)
    trainer = Trainer(_model(source), source, source.lm_head, s, tmp_path / "c", RecordingReporter())
    trainer.run()
    by_sample = per_sample_validation(trainer)
    whole = trainer.evaluate("val")
    assert by_sample["index"] == [float(i) for i in range(1000, 1012)]
    w, tau, loss = (np.array(by_sample[k]) for k in ("tokens", "tau", "loss"))
    assert w.sum() == whole["tokens"]
    # at one speculative step tau's denominator is the counted positions: the weighted mean is the pass's tau
    assert (w * tau).sum() / w.sum() == pytest.approx(whole["predicted_tau"], rel=1e-6)
    assert (w * loss).sum() / w.sum() == pytest.approx(whole["loss"], rel=0.05)  # its denominators drop OOV
    assert np.std(loss) > 0 and trainer.model.training  # samples differ; the model is left training
