"""train.bench_every and train.stop_on: deployed tau during training, and a best checkpoint that reads it.

The loop's test plants a deployed-tau curve that peaks at step 10 while val/loss keeps falling: stop_on=tau must
export the weights of step 10, stop_on=loss those of the loss minimum. The stage's test benches a tiny target's
draft for real, with the local engine.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from draftlab.util.reporting import RecordingReporter
from draftlab.train.checkpoint import trainable_state
from draftlab.train.loop import Trainer
from draftlab.train.tau_curve import tau_during_training
from test_train_loop import FakeSource, _model, _settings

PEAK = 10
CURVE = {step: 3.0 - 0.02 * abs(step - PEAK) for step in range(0, 31)}  # tau peaks at step 10, then falls


def _run(tmp_path, stop_on):
    source = FakeSource()
    seen = {}

    def bench(model):  # the planted deployed tau, and the weights it was read on
        step = trainer.state["step"]
        seen[step] = {k: v.detach().clone() for k, v in trainable_state(model).items()}
        return CURVE[step]

    settings = _settings(epochs=None, max_steps=30, eval_every=5, bench_every=5, stop_on=stop_on, lr=1e-2,
                         checkpoint_every=1000)
    trainer = Trainer(_model(source), source, source.lm_head, settings, tmp_path / stop_on, RecordingReporter(),
                      bench=bench)
    return trainer, trainer.run(), seen


def test_stop_on_tau_keeps_the_tau_peak_before_the_loss_minimum(tmp_path):
    trainer, result, seen = _run(tmp_path, "tau")
    losses = [(h["step"], h["val/loss"]) for h in result.history if "val/loss" in h]
    loss_min = min(losses, key=lambda p: p[1])[0]
    assert loss_min > PEAK  # the planted case: loss still falls after tau peaked
    assert result.best["best/step"] == PEAK and result.best["best/bench_tau"] == pytest.approx(CURVE[PEAK])
    assert "best/val_loss" in result.best  # the peak's validation pass is its metrics too
    best = load_file(str(result.best_weights))
    assert all(torch.equal(best[k], seen[PEAK][k].to(best[k].dtype)) for k in best)
    during = tau_during_training(result.history, trainer.state["bench"])
    assert during["train/tau_peaked_first"] == 1.0 and during["train/bench_tau_peak_step"] == PEAK
    assert during["train/bench_tau_after_peak"] == pytest.approx(CURVE[30] / CURVE[PEAK] - 1.0)
    assert [b["step"] for b in trainer.state["bench"]] == [5, 10, 15, 20, 25, 30]


def test_stop_on_loss_keeps_the_loss_minimum_and_benches_alongside(tmp_path):
    trainer, result, _ = _run(tmp_path, "loss")
    losses = [(h["step"], h["val/loss"]) for h in result.history if "val/loss" in h]
    assert result.best["best/step"] == min(losses, key=lambda p: p[1])[0] != PEAK
    logged = [step for step, values in trainer.reporter.history if "train/bench_tau" in values]
    assert logged == [5, 10, 15, 20, 25, 30]


def test_stop_on_tau_needs_bench_every():
    from draftlab.config.config import ConfigError, default_config

    with pytest.raises(ConfigError, match="train.stop_on"):
        default_config({"train": {"stop_on": "tau", "bench_every": None}})
    with pytest.raises(ConfigError, match="train.stop_on"):
        default_config({"train": {"stop_on": "best"}})


def test_the_train_stage_benches_the_draft_with_the_local_engine(tiny_cfg, tmp_path):
    from draftlab.task import run_task

    run_task(tiny_cfg("data.samples=16", "tracking.enabled=false", "stages=[generate,extract,train]",
                      "train.bench_every=1", "train.bench_prompts=2", "train.bench_max_new_tokens=6"))
    (manifest,) = tmp_path.rglob("train/*/manifest.json")
    metrics = json.loads(manifest.read_text())["metrics"]
    assert metrics["train/bench_tau_peak"] >= 1.0 and "train/tau_peaked_first" in metrics
    assert (manifest.parent / "tau_during_training.png").exists()
