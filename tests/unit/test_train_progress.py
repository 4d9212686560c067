"""What the training loop says while it runs: the share of time spent waiting for batches, and each validation
pass in the log (a job killed before it writes results.json still shows its curve there); its log window's
sums, and the attention kernels a step may take (both were host time on the H200)."""

from __future__ import annotations

import logging
import types

import pytest

from draftlab.model import draft
from draftlab.util.reporting import RecordingReporter
from draftlab.train import loop, scored
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

    def batches(self, split, *args, **kwargs):
        for batch in super().batches(split, *args, **kwargs):
            if split == "train":
                self.clock.now += self.read_s
            yield batch


def test_data_wait_share_is_the_time_spent_waiting_for_batches(tmp_path, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    monkeypatch.setattr(scored, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
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


def test_each_validation_pass_is_logged_with_the_best_so_far(tmp_path, caplog, monkeypatch):
    clock = Clock()  # each validation pass takes 2.5 (fake) seconds, and its log line says so
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    monkeypatch.setattr(scored, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    source = FakeSource()
    trainer = Trainer(_model(source), source, source.lm_head, _settings(epochs=3, eval_every=2, log_every=2),
                      tmp_path / "ckpt", RecordingReporter())
    evaluate = trainer.evaluate

    def slow_evaluate(*args):
        clock.now += 2.5
        return evaluate(*args)

    monkeypatch.setattr(trainer, "evaluate", slow_evaluate)
    with caplog.at_level(logging.INFO, logger="draftlab"):
        result = trainer.run()
    lines = [r.getMessage() for r in caplog.records if " val/loss " in r.getMessage()]
    assert all(", a 2.5 s pass (best so far " in line for line in lines), lines
    assert len(lines) == len(result.history) >= 3
    for k, (line, entry) in enumerate(zip(lines, result.history)):
        assert line.startswith(f"train: step {int(entry['step'])} val/loss {entry['val/loss']:.4f} ")
        if k == 0:
            assert line.endswith("(best so far -)")
        else:  # the best of the passes before this one
            best = min(result.history[:k], key=lambda e: e["val/loss"])
            assert line.endswith(f"(best so far {best['val/loss']:.4f} at step {int(best['step'])})"), line


def test_the_log_window_sums_what_its_steps_produced(tmp_path, monkeypatch):
    """The window's sums stay on the device between logs (train/window.py); what is logged is still each window's
    mean gradient norm and tokens per second, also when a checkpoint folds the sums in the middle of a window."""
    clock = Clock()
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    monkeypatch.setattr(scored, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    source = FakeSource()
    rep = RecordingReporter()
    trainer = Trainer(_model(source), source, source.lm_head,
                      _settings(epochs=2, log_every=5, checkpoint_every=3, batch_tokens=100), tmp_path / "ckpt", rep)
    norms, tokens, clip = [], [], loop.torch.nn.utils.clip_grad_norm_

    def recording_clip(*args, **kwargs):
        norms.append(float(clip(*args, **kwargs)))
        return loop.torch.tensor(norms[-1])

    monkeypatch.setattr(loop.torch.nn.utils, "clip_grad_norm_", recording_clip)
    step = trainer._train_step

    def timed_step(batch, *args):  # one (fake) second a step, nothing else takes time
        tokens.append(int(batch["attention_mask"].sum()))
        step(batch, *args)
        clock.now += 1.0

    monkeypatch.setattr(trainer, "_train_step", timed_step)
    trainer.run()
    logged = [(int(s), v) for s, v in rep.history if "train/grad_norm" in v]
    assert len(logged) >= 3 and any(s % 5 for s, _ in logged)  # windows cut short by an epoch's end too
    done = 0
    for step_no, values in logged:
        window = slice(done, step_no)
        assert values["train/grad_norm"] == pytest.approx(sum(norms[window]) / len(norms[window]))
        assert values["train/tokens_per_s"] == pytest.approx(sum(tokens[window]) / len(tokens[window]))
        done = step_no
    assert done == len(norms) == len(tokens)


def test_a_run_resumed_inside_a_log_window_logs_that_window_whole(tmp_path):
    """A checkpoint written inside a window carries the window's sums so far: the resumed run logs the window
    an unbroken run logs."""
    source = FakeSource()
    settings = _settings(epochs=1, log_every=5, checkpoint_every=3, batch_tokens=100)

    def windows(folder, on_step=None) -> dict:
        rep = RecordingReporter()
        trainer = Trainer(_model(source), source, source.lm_head, settings, folder, rep, on_step)
        trainer.run()
        return {int(s): (v["train/loss"], v["train/grad_norm"]) for s, v in rep.history if "train/grad_norm" in v}

    unbroken = windows(tmp_path / "a")

    def killed_after_step_7(step):  # its last checkpoint is step 6: two steps into the window of steps 6-10
        if step == 7:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        windows(tmp_path / "b", killed_after_step_7)
    resumed = windows(tmp_path / "b")
    assert 10 in unbroken and resumed[10] == unbroken[10]


def test_training_attention_never_goes_to_cudnn(tmp_path, monkeypatch):
    """cuDNN's attention plans every new shape on the host (44 ms a pass on the H200); the trainer's batches all
    have new shapes, so every attention call in training and validation runs with cuDNN's kernel switched off."""
    source = FakeSource()
    trainer = Trainer(_model(source), source, source.lm_head, _settings(epochs=1, batch_tokens=100), tmp_path / "c")
    functional, cudnn_allowed = draft.F, []

    class Spy:  # the draft's `F`, with attention recorded (torch's own stays in place: causal masks dispatch on it)
        def __getattr__(self, name):
            return getattr(functional, name)

        def scaled_dot_product_attention(self, *args, **kwargs):
            cudnn_allowed.append(loop.torch.backends.cuda.cudnn_sdp_enabled())
            return functional.scaled_dot_product_attention(*args, **kwargs)

    monkeypatch.setattr(draft, "F", Spy())
    assert loop.torch.backends.cuda.cudnn_sdp_enabled()  # PyTorch's default: the test can fail
    trainer.run()
    assert cudnn_allowed and not any(cudnn_allowed)
