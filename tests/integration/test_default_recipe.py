"""The default recipes train to convergence, and a run that hits its cap says so (issue 10): a user's first sweep
must not read an under-trained draft as a converged one."""

from __future__ import annotations

import logging

import pytest

from conftest import CONF, compose_config
from draftlab.config.config import ConfigError, validate
from draftlab.task import run_task


@pytest.mark.parametrize("overrides", [[], ["hardware=gpu"], ["experiment=data_scaling"], ["experiment=layers"]])
def test_default_recipes_train_to_convergence_under_a_cap(overrides):
    train = validate(compose_config(overrides)).train
    assert train.schedule == "wsd" and train.early_stop_patience and train.max_steps, overrides
    assert train.epochs is None  # the cap is in steps: nothing else sets the budget


def test_train_epochs_still_sets_a_budget_in_passes():
    train = validate(compose_config(["train.max_steps=null", "train.epochs=3"])).train
    assert train.epochs == 3 and train.max_steps is None
    epochs = validate(compose_config(["experiment=epochs", "train.epochs=4"])).train
    assert epochs.max_steps is None and epochs.early_stop_patience is None and epochs.epochs == 4
    with pytest.raises(ConfigError, match=r"^train\.max_steps: no training budget"):
        validate(compose_config(["train.max_steps=null"]))
    with pytest.raises(ConfigError, match=r"^train\.init_from: 'shorter'"):
        validate(compose_config(["train.init_from=shorter"]))


@pytest.mark.parametrize("experiment",
                         sorted(p.stem for p in (CONF / "experiment").glob("*.yaml") if p.stem != "smoke"))
def test_every_experiment_has_a_budget_on_the_smoke_recipe(experiment):
    """A sweep's callback validates the base config, without the sweeper's values: each named recipe, also on top
    of the tiny one (as the tests sweep it), must have a training budget of its own."""
    validate(compose_config([f"experiment=[smoke,{experiment}]"]))


def _summary(caplog) -> str:
    table = caplog.records[-1].getMessage()
    return " ".join(table.replace("│", " ").split())  # the table folds long lines


def test_a_capped_run_is_not_called_converged(tiny_cfg, caplog):
    cfg = tiny_cfg("stages=[generate,extract,train]", "tracking.enabled=false", "train.epochs=null",
                   "train.max_steps=3", "train.eval_every=1", "train.early_stop_patience=4")
    with caplog.at_level(logging.INFO, logger="draftlab"):
        metrics = run_task(cfg)
    assert metrics["train/converged"] == 0.0 and metrics["train/stopped_early"] == 0.0
    summary = _summary(caplog)
    assert "NOT converged: the budget ran out at 3 steps" in summary
    assert "train: NOT converged: the run used its whole budget (3 steps, train.max_steps=3)" in summary
    assert "raise train.max_steps" in summary


def test_a_plateaued_run_is_converged_and_a_fixed_budget_is_neither(tiny_cfg, caplog):
    # min_delta 0.9: no pass after the first is a material improvement, so the plateau fires at the third pass
    cfg = tiny_cfg("stages=[generate,extract,train]", "tracking.enabled=false", "train.epochs=null",
                   "train.max_steps=40", "train.eval_every=1", "train.early_stop_patience=2",
                   "train.early_stop_min_delta=0.9")
    with caplog.at_level(logging.INFO, logger="draftlab"):
        metrics = run_task(cfg)
    assert metrics["train/converged"] == 1.0 and metrics["train/steps"] < 40
    assert "converged (val/loss plateau)" in _summary(caplog) and "NOT converged" not in _summary(caplog)

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="draftlab"):
        metrics = run_task(tiny_cfg("stages=[generate,extract,train]", "tracking.enabled=false"))  # smoke: 1 pass
    assert "train/converged" not in metrics
    assert "a fixed budget (no early stopping)" in _summary(caplog)


def test_an_epochs_setting_that_max_steps_overrides_is_said(caplog):
    from draftlab.stages.train import budget_note

    with caplog.at_level(logging.WARNING, logger="draftlab"):
        budget_note(validate(compose_config(["train.epochs=5"])).train)
    assert "train.epochs=5 is not the budget: train.max_steps=" in caplog.text
    caplog.clear()
    budget_note(validate(compose_config()).train)
    assert not caplog.records
