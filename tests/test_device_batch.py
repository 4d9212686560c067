"""Batches on their way to the device (train/device_batch.py): the packed plan the source attaches is the one the
unroll gets, and training with it equals training with the plan listed in the loop."""

from __future__ import annotations

import torch

from draftlab.reporting import RecordingReporter
from draftlab.train.loop import Trainer
from test_train_loop import FakeSource, _model, _settings


def test_the_packed_plan_comes_from_the_source_and_trains_as_one_built_in_the_loop(tmp_path, monkeypatch):
    """The trainer hands `prepare` to the source (FeatureSource runs it on its read-ahead worker) and the unroll gets
    the very plan it attached; a source that ignores `prepare` gets its plan built in the loop: the same weights."""
    import draftlab.train.loop as loop

    class IgnoresPrepare(FakeSource):
        def batches(self, split, epoch, batch_tokens, max_seq_len, seed, shuffle, prepare=None):
            return super().batches(split, epoch, batch_tokens, max_seq_len, seed, shuffle)

    weights, used = {}, {}
    for name, source in (("attached", FakeSource()), ("in the loop", IgnoresPrepare())):
        attached, given = set(), []
        real_attach, real_unroll = Trainer._attach_plan, loop.packed_unroll

        def attach(self, batch):
            batch = real_attach(self, batch)
            attached.add(id(batch["packed_plan"]))
            return batch

        def unroll(*args, plan=None, **kwargs):
            given.append(id(plan) in attached)
            return real_unroll(*args, plan=plan, **kwargs)

        monkeypatch.setattr(loop.Trainer, "_attach_plan", attach)
        monkeypatch.setattr(loop, "packed_unroll", unroll)
        trainer = Trainer(_model(source), source, source.lm_head, _settings(epochs=1, checkpoint_every=10_000),
                          tmp_path / name, RecordingReporter())
        trainer.run()
        weights[name] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        used[name] = given
        monkeypatch.undo()
    assert used["attached"] and all(used["attached"])  # every step and validation batch: the source's plan
    assert used["in the loop"] and not any(used["in the loop"])
    for k, v in weights["attached"].items():
        assert torch.equal(v, weights["in the loop"][k]), k
