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


def test_data_scaling_gpu_scores_every_size_on_one_validation_set():
    """The five sweeps of docs/data_scaling.md share one validation set and one convergence rule; the sizes in
    its header are doublings from 1,600 to 51,200, largest first."""
    cfg = validate(compose_config(["experiment=data_scaling_gpu", "target=tiny"]))
    assert cfg.hardware.name == "gpu" and cfg.data.val_samples == 1000
    assert cfg.train.plateau_test == "slope" and cfg.train.schedule == "wsd" and cfg.train.early_stop_patience
    assert list(cfg.stages) == ["generate", "extract", "train"]
    sizes = _sweep("data_scaling_gpu")["data.samples"]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] == 51200
    header = (CONF / "experiment" / "data_scaling_gpu.yaml").read_text()
    listed = {int(n) for line in header.splitlines() if "data.samples=" in line
              for n in line.split("data.samples=")[1].split()[0].split(",")}
    assert sorted(listed | {int(n) for n in sizes}) == [1600 * 2 ** i for i in range(6)]


def test_epochs_experiment_stays():
    assert _sweep("epochs")["train.epochs"] == [2.0, 4.0, 8.0, 16.0]


def test_the_gpu_script_runs_the_headers_sweeps_as_valid_overrides(tmp_path):
    """bench/gpu/data_scaling.sh reads its sweeps from the experiment's header: five, each composing (first value
    of every swept key) into a config that validates, the probe and the two ablations at the largest size."""
    import subprocess

    (tmp_path / "code").symlink_to(CONF.parent)
    done = subprocess.run(["bash", str(CONF.parent / "bench" / "gpu" / "data_scaling.sh"), "sweeps"],
                          env={"G": str(tmp_path), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          check=True)
    lines = done.stdout.splitlines()
    assert len(lines) == 5 and lines[0] == ""  # the first is the experiment's own sweep
    for line in lines:
        overrides = [o.split(",")[0] for o in line.split()]
        cfg = validate(compose_config(["experiment=data_scaling_gpu", "target=tiny", *overrides]))
        if "train.extend_steps" in line:
            assert cfg.train.extend_steps > 0 and cfg.train.seed == 0 and cfg.data.samples == 51200
    assert sum(1 for line in lines if "data.samples=51200 " in line + " ") == 2  # the ablations
