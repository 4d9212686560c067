"""Batches on their way to the device (train/device_batch.py): the packed plan the source attaches is the one the
unroll gets, and training with it equals training with the plan listed in the loop; padding
the length (what a compiled unroll is fed) changes no result."""

from __future__ import annotations

import logging

import pytest
import torch

from draftlab.util.reporting import RecordingReporter
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


def test_padding_to_a_multiple_of_8_changes_nothing_but_the_shape():
    """What a compiled unroll is fed (train/device_batch.py): the batch padded past every sequence's end, with its plan
    listed for the padded length, gives the loss, stats and gradients of the batch as read."""
    from draftlab.train.device_batch import attach_plan, to_device
    from draftlab.train.packed import packed_unroll
    from test_packed_unroll import _batch, _run
    from test_ttt import _model as tiny_model

    model = tiny_model(layers=2)
    full, lm_head = _batch()  # 15 positions: one added; 9 positions: seven added, more than the TTT steps
    batch = {k: v[:, :9].contiguous() for k, v in full.items()}
    results = {}
    for multiple in (1, 8):
        on_device, plan = to_device(attach_plan(batch, 3, multiple), torch.device("cpu"), 3)
        assert plan.shape == (4, 9 if multiple == 1 else 16) and on_device["features"].shape[1] == plan.shape[1]
        results[multiple] = _run(lambda: packed_unroll(model, on_device, lm_head, 3, 0.8, plan=plan), model)
        # the padded (all positions) unroll too: the positions added are never attended to by a real one
        results[multiple, "padded"] = _run(lambda: packed_unroll(model, on_device, lm_head, 3, 0.8, plan=plan,
                                                                 max_kept=0.0), model)
    for key in (8, (8, "padded")):
        loss, stats, grads = results[key]
        want_loss, want_stats, want_grads = results[1 if key == 8 else (1, "padded")]
        assert torch.allclose(loss, want_loss, rtol=1e-6) and torch.allclose(stats, want_stats, rtol=1e-6, atol=1e-6)
        assert grads.keys() == want_grads.keys()
        for name, grad in grads.items():
            assert torch.allclose(grad, want_grads[name], rtol=1e-5, atol=1e-7), (key, name)
    # a plan listed in the loop pads the same way
    on_device, plan = to_device(full, torch.device("cpu"), 3, multiple=8)
    assert plan.shape == (4, 16) and all(v.shape[1] == 16 for v in on_device.values())


def test_cuda_graphs_pad_batches_to_buckets_and_only_on_cuda(caplog):
    """train.compile_cuda_graphs: a graph is recorded per distinct set of sizes, so batches are padded to buckets
    (the padding's equivalence: tests/unit/test_packed_unroll.py); the eager and the plain compiled unroll pad as
    before."""
    from draftlab.train.compiled_unroll import CompiledUnroll, unroll_core_for
    from draftlab.train.device_batch import padding_for

    assert padding_for(None, 16384) == {"multiple": 1}
    assert padding_for(CompiledUnroll(backend="aot_eager"), 16384) == {"multiple": 8}
    assert padding_for(CompiledUnroll(cuda_graphs=True), 16384) == {"multiple": 64, "rows": 8, "counts": 2048}
    assert padding_for(CompiledUnroll(cuda_graphs=True), 256) == {"multiple": 64, "rows": 8, "counts": 64}
    # train.graph_count_bucket: the counts' multiple set, and only where graphs are recorded
    assert padding_for(CompiledUnroll(cuda_graphs=True), 16384, 512) == {"multiple": 64, "rows": 8, "counts": 512}
    assert padding_for(CompiledUnroll(backend="aot_eager"), 16384, 512) == {"multiple": 8}
    assert CompiledUnroll(backend="aot_eager", cuda_graphs=True).cuda_graphs is False  # an inductor option
    with caplog.at_level(logging.WARNING, logger="draftlab"):
        assert unroll_core_for("true", torch.device("cpu"), cuda_graphs=True).cuda_graphs is False  # nothing to record
        assert unroll_core_for("false", torch.device("cpu"), cuda_graphs=True) is None
    assert caplog.text.count("train.compile_cuda_graphs needs the compiled unroll on CUDA") == 2, caplog.text


def test_cuda_graphs_auto_records_for_narrow_drafts_on_cuda_only():
    """train.compile_cuda_graphs=auto: on CUDA below GRAPHS_MAX_HIDDEN (SmolLM2's 576 on, Llama-3.1-8B's 4096
    off); true and false as set; anything else refused naming the key."""
    from draftlab.train.compile_choice import GRAPHS_MAX_HIDDEN, cuda_graphs_wanted

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert cuda_graphs_wanted("auto", cuda, 576) and not cuda_graphs_wanted("auto", cuda, 4096)
    assert not cuda_graphs_wanted("auto", cuda, GRAPHS_MAX_HIDDEN) and cuda_graphs_wanted("auto", cuda, 2047)
    assert not cuda_graphs_wanted("auto", cpu, 576)
    assert cuda_graphs_wanted("True", cuda, 4096) and cuda_graphs_wanted(True, cpu, 576)  # as set
    assert not cuda_graphs_wanted("false", cuda, 576) and not cuda_graphs_wanted(False, cuda, 576)
    with pytest.raises(ValueError, match="train.compile_cuda_graphs"):
        cuda_graphs_wanted("sometimes", cuda, 576)


def test_the_trainer_pads_to_its_graph_count_bucket(tmp_path, monkeypatch):
    """train.graph_count_bucket reaches the trainer's padding (a core that records CUDA graphs, stood in on the CPU);
    unset, the counts' multiple is an eighth of the token budget."""
    from draftlab.util.reporting import RecordingReporter
    from draftlab.train import loop
    from draftlab.train.compiled_unroll import CompiledUnroll
    from test_train_loop import FakeSource, _model, _settings

    calls = []  # the trainer hands its draft's width on for train.compile_cuda_graphs=auto
    monkeypatch.setattr(loop, "unroll_core_for", lambda *args: calls.append(args) or CompiledUnroll(cuda_graphs=True))
    source = FakeSource()
    for bucket, counts in ((None, 64), (96, 96)):  # batch_tokens 200: an eighth is 25, raised to 64
        settings = _settings(compile_cuda_graphs=True, graph_count_bucket=bucket)
        trainer = loop.Trainer(_model(source), source, source.lm_head, settings, tmp_path / str(bucket),
                               RecordingReporter())
        assert trainer.padding == {"multiple": 64, "rows": 8, "counts": counts}
        assert calls[-1][-2:] == (True, trainer.model.cfg.hidden_size)
