"""The trainer's file writes off the main thread (train/file_queue.py): written in the order queued, a snapshot
owned by the write (the next step changes the live tensors in place), a failed write raised in the loop's thread,
and a trainer's run that returns only once its files are all on disk."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import torch
from safetensors.torch import load_file

from draftlab.train import loop as loop_module
from draftlab.train.checkpoint import latest_checkpoint, read_checkpoint, snapshot_checkpoint, write_snapshot
from draftlab.train.file_queue import FileQueue
from draftlab.train.loop import Trainer
from test_train_loop import FakeSource, _model, _settings


def test_writes_run_in_the_order_queued_and_off_the_callers_thread():
    done, threads = [], set()

    def write(i):
        time.sleep(0.02 if i % 2 == 0 else 0.0)  # a slow write first must still finish first
        threads.add(threading.get_ident())
        done.append(i)

    with FileQueue(depth=3) as files:
        for i in range(6):
            files.submit(write, i)
    assert done == list(range(6))
    assert threads and threading.get_ident() not in threads


def test_submit_waits_while_depth_writes_are_queued():
    release = threading.Event()
    files = FileQueue(depth=2)
    files.submit(release.wait)
    files.submit(lambda: None)
    third = threading.Thread(target=files.submit, args=(lambda: None,))
    third.start()
    third.join(0.2)
    assert third.is_alive()  # blocked behind the first write
    release.set()
    third.join(5)
    assert not third.is_alive()
    files.close()


def test_a_failed_write_is_raised_at_the_next_submit_and_nothing_after_it_runs():
    ran = []

    def fail():
        raise OSError("disk full")

    files = FileQueue(depth=3)
    files.submit(fail)
    while not files._pending[0].done():  # the failure has happened, still unseen by the loop
        time.sleep(0.001)
    with pytest.raises(OSError, match="disk full"):
        files.submit(ran.append, "a prune")  # not queued behind a failed checkpoint
    files.submit(ran.append, "later")
    with pytest.raises(RuntimeError, match="earlier file write failed"):
        files.close()
    assert ran == []
    files.submit(ran.append, "a new run")  # closed: its error was raised, the next run writes again
    files.close()
    assert ran == ["a new run"]


def test_an_error_in_the_block_is_raised_over_a_failed_write(caplog):
    def fail():
        raise OSError("disk full")

    with caplog.at_level(logging.WARNING, logger="draftlab"):
        with pytest.raises(KeyError):
            with FileQueue() as files:
                files.submit(fail)
                raise KeyError("the loop's own error")
    assert "disk full" in caplog.text


def test_a_snapshot_keeps_the_values_of_when_it_was_taken(tmp_path):
    """On the CPU `.cpu()` returns the live tensor itself: a snapshot that kept it would write the weights and the
    optimizer state of a later step."""
    weight = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.AdamW([weight])
    weight.sum().backward()
    opt.step()
    state = {"step": 1, "history": [{"step": 1.0}]}
    snapshot = snapshot_checkpoint({"w": weight.detach().cpu()}, opt.state_dict(), state)
    before_w = weight.detach().clone()
    before_avg = opt.state[weight]["exp_avg"].clone()
    weight.grad = torch.full((4,), 3.0)
    opt.step()  # changes the weight and the moments in place
    state["history"].append({"step": 2.0})
    assert not torch.equal(weight.detach(), before_w)
    write_snapshot(tmp_path, "ckpt-000000001-e0000-b000000001", snapshot)
    folder = latest_checkpoint(tmp_path)
    assert torch.equal(load_file(str(folder / "model.safetensors"))["w"], before_w)
    trainer_state, optimizer = read_checkpoint(folder)
    assert torch.equal(optimizer["state"][0]["exp_avg"], before_avg)
    assert trainer_state["history"] == [{"step": 1.0}]


def test_a_trainer_raises_a_failed_checkpoint_write(tmp_path, monkeypatch):
    """The write runs on the queue's thread; its error still ends the run, in the caller's thread."""
    def broken(*args):
        raise OSError("checkpoint volume gone")

    monkeypatch.setattr(loop_module, "write_snapshot", broken)
    source = FakeSource(n_train=24, n_val=8)
    trainer = Trainer(_model(source), source, source.lm_head, _settings(batch_tokens=100), tmp_path)
    with pytest.raises(OSError, match="checkpoint volume gone"):
        trainer.run()
    assert latest_checkpoint(tmp_path) is None


def test_a_trainer_returns_with_every_file_written(tmp_path, monkeypatch):
    """Slow writes: run() still returns only once the last checkpoint and the best weights are on disk."""
    real_snapshot, real_write = loop_module.snapshot_checkpoint, loop_module.write_snapshot
    taken, written = [], []

    def snapshot(*args):  # on the loop's thread, when a checkpoint is queued
        taken.append(args[2]["step"])
        return real_snapshot(*args)

    def slow_write(*args):
        time.sleep(0.1)
        real_write(*args)
        written.append(args[2]["trainer"]["step"])

    monkeypatch.setattr(loop_module, "snapshot_checkpoint", snapshot)
    monkeypatch.setattr(loop_module, "write_snapshot", slow_write)
    source = FakeSource(n_train=24, n_val=8)
    trainer = Trainer(_model(source), source, source.lm_head, _settings(batch_tokens=100), tmp_path)
    result = trainer.run()
    assert len(taken) >= 3 and written == taken
    assert result.best_weights.exists()
    latest = latest_checkpoint(tmp_path)
    assert read_checkpoint(latest)[0]["step"] == result.steps
    assert sorted(p.name for p in tmp_path.glob("best-epoch*")) == [result.best_weights.name]


def test_a_failed_checkpoint_keeps_the_best_file_the_last_good_one_names(tmp_path, monkeypatch):
    """An epoch's end queues a best file, a checkpoint and a prune. With the checkpoint failing, the prune must not
    run: it would delete the best file that the last good checkpoint (the one `latest.json` names) points at."""
    real, calls = loop_module.write_snapshot, []

    def full_after_the_first(*args):
        calls.append(args[1])
        if len(calls) > 1:
            raise OSError(28, "No space left on device")
        real(*args)

    monkeypatch.setattr(loop_module, "write_snapshot", full_after_the_first)
    source = FakeSource(n_train=24, n_val=8)
    settings = _settings(batch_tokens=100, epochs=4, checkpoint_every=100)  # checkpoints at epoch ends only
    with pytest.raises(OSError, match="No space left"):
        Trainer(_model(source), source, source.lm_head, settings, tmp_path).run()
    state, _ = read_checkpoint(latest_checkpoint(tmp_path))
    assert (tmp_path / state["best"]["file"]).exists()


def test_best_weights_are_those_of_the_best_pass_though_written_later(tmp_path, monkeypatch):
    """A best file is written on the queue's thread while the next steps change the weights in place (on the CPU
    the state dict holds the live tensors): each one written must hold the weights of its validation pass."""
    real = loop_module.fsutil.atomic_save_safetensors
    weights_at, checked = {}, []

    def slow(path, tensors, *args, **kwargs):
        time.sleep(0.05)  # the loop steps on meanwhile
        if path.name.startswith("best-"):
            step = int(path.stem.rsplit("step", 1)[1])
            checked.append((step, all(torch.equal(v, weights_at[step][k]) for k, v in tensors.items())))
        return real(path, tensors, *args, **kwargs)

    monkeypatch.setattr(loop_module.fsutil, "atomic_save_safetensors", slow)
    source = FakeSource(n_train=24, n_val=8)
    trainer = None

    def keep(step):  # after the step's validation, before the next optimizer step
        weights_at[step] = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}

    trainer = Trainer(_model(source), source, source.lm_head, _settings(batch_tokens=100, eval_every=2), tmp_path,
                      on_step=keep)
    result = trainer.run()
    assert len(checked) >= 2 and checked[0][0] < result.steps  # steps ran while earlier best files were queued
    assert all(same for _, same in checked), checked
