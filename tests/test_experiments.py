"""The named sweeps that separate optimizer steps from data (issue 10), composed the way src/run.py composes them."""

from __future__ import annotations

import math

from omegaconf import OmegaConf

from conftest import CONF, compose_config
from draftlab.config import validate


def _sweep(name: str) -> dict[str, list[float]]:
    params = OmegaConf.load(CONF / "experiment" / f"{name}.yaml").hydra.sweeper.params
    return {k: [float(v) for v in str(vals).split(",")] for k, vals in params.items()}


def _doublings(values: list[float]) -> bool:
    v = sorted(values)
    return all(math.isclose(b / a, 2.0) for a, b in zip(v, v[1:]))


def test_steps_vs_data_is_a_grid_of_doublings_on_both_axes():
    grid = _sweep("steps_vs_data")
    assert set(grid) == {"data.samples", "train.max_steps"}
    for axis in grid.values():
        assert len(axis) >= 3 and _doublings(axis)
    assert grid["data.samples"] == sorted(grid["data.samples"], reverse=True)  # largest first: one shared pool
    cfg = validate(compose_config(["experiment=steps_vs_data", "target=tiny"]))
    assert cfg.train.schedule == "wsd" and cfg.train.early_stop_patience is None  # the budget is the variable
    assert cfg.tracking.experiment == "steps_vs_data"


def test_data_scaling_trains_every_size_to_convergence_by_default():
    cfg = validate(compose_config(["experiment=data_scaling", "target=tiny"]))
    assert cfg.train.early_stop_patience and cfg.train.max_steps and cfg.train.eval_every
    assert cfg.train.schedule == "wsd"  # a plateau starts the decay (docs/ARCHITECTURE.md)
    assert _doublings(_sweep("data_scaling")["data.samples"])


def test_epochs_experiment_stays():
    assert _sweep("epochs")["train.epochs"] == [2.0, 4.0, 8.0, 16.0]
