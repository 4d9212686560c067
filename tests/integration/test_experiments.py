"""The named sweeps that separate optimizer steps from data, composed the way src/run.py composes them, and the GPU
script that runs the data-scaling ones."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import CONF, compose_config
from draftlab.config.config import validate


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
    """benchmarks/gpu/data_scaling.sh reads its sweeps from the experiment's header. Expanded as Hydra's sweeper does
    (the experiment's sweep params, then the line's overrides): 6 + 3 jobs of sizes and seeds, the steps probe at
    the two largest sizes (seed 0), each ablation at the largest size with 2 seeds; every job validates."""
    import subprocess

    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    (tmp_path / "code").symlink_to(CONF.parent)
    done = subprocess.run(["bash", str(CONF.parent / "benchmarks" / "gpu" / "data_scaling.sh"), "sweeps"],
                          env={"G": str(tmp_path), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          check=True)
    params = OmegaConf.load(CONF / "experiment" / "data_scaling_gpu.yaml").hydra.sweeper.params
    parser = OverridesParser.create()
    sweeps = []
    for line in done.stdout.splitlines():
        overrides = parser.parse_overrides([f"{k}={v}" for k, v in params.items()] + line.split())
        sweeps.append(BasicSweeper.split_arguments(overrides, None)[0])
    assert [len(jobs) for jobs in sweeps] == [6, 3, 2, 2, 2]
    probe, last, two_layers = sweeps[2:]
    assert {tuple(job) for job in probe} == {("data.samples=51200", "train.seed=0", "train.extend_steps=4000"),
                                              ("data.samples=25600", "train.seed=0", "train.extend_steps=4000")}
    for jobs, setting in ((last, "extract.layers=last"), (two_layers, "draft.num_layers=2")):
        assert sorted(jobs) == [["data.samples=51200", f"train.seed={s}", setting] for s in (0, 1)]
    for job in (job for jobs in sweeps for job in jobs):
        validate(compose_config(["experiment=data_scaling_gpu", "target=tiny", *job]))


@pytest.mark.parametrize("part, sweeps", [("a", "1"), ("b", "2 3"), ("c", "4 5"), ("all", "1 2 3 4 5"),
                                          ("5,4", "4 5"), ("3", "3"), ("6", None), ("0", None), ("3,", None),
                                          ("d", None)])
def test_the_gpu_script_names_a_parts_sweeps(tmp_path, part, sweeps):
    """A part is a, b or c (each about half an hour of jobs), all, or sweep numbers for the ones a stopped part
    left unrun."""
    import subprocess

    (tmp_path / "code").symlink_to(CONF.parent)
    done = subprocess.run(["bash", str(CONF.parent / "benchmarks" / "gpu" / "data_scaling.sh"), "part", part],
                          env={"G": str(tmp_path), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    if sweeps is None:
        assert done.returncode == 2 and f"not {part}" in done.stderr
    else:
        assert done.returncode == 0 and done.stdout.split() == sweeps.split()


@pytest.mark.parametrize("parts", [[], ["a", "d"], ["1:data.samples=6400", "7:train.seed=0"]])
def test_the_gpu_script_refuses_a_bad_part_before_it_starts(tmp_path, parts):
    """`start` checks every part (PART or PART:OVERRIDES) before the detached job exists, not minutes into it."""
    import subprocess

    (tmp_path / "code").symlink_to(CONF.parent)
    done = subprocess.run(["bash", str(CONF.parent / "benchmarks" / "gpu" / "data_scaling.sh"), "start", *parts],
                          env={"G": str(tmp_path), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert done.returncode == 2 and not (tmp_path / "pid").exists()
    assert ("PART..." in done.stderr) if not parts else (f"not {parts[-1].split(':')[0]}" in done.stderr)


def test_the_gpu_script_asks_for_the_validation_sets_whole_shard_first(tmp_path):
    """Every machine's pool is first asked for exactly its first shard (the validation set and the training samples
    after it), so each machine answers that shard whole, as the committed records' pool was answered."""
    import subprocess

    (tmp_path / "code").symlink_to(CONF.parent)
    path = f"{Path(sys.executable).parent}:/usr/bin:/bin"  # its python3 composes the experiment
    done = subprocess.run(["bash", str(CONF.parent / "benchmarks" / "gpu" / "data_scaling.sh"), "first_shard"],
                          env={"G": str(tmp_path), "PATH": path}, capture_output=True, text=True, check=True)
    gpu = OmegaConf.load(CONF / "hardware" / "gpu.yaml")
    experiment = OmegaConf.load(CONF / "experiment" / "data_scaling_gpu.yaml")
    assert "shard_size" not in experiment.data  # the experiment keeps the hardware's shards
    assert int(done.stdout) + experiment.data.val_samples == gpu.data.shard_size == 16384
