"""Cluster sweeps through hydra-submitit-launcher: a 2-job `submitit_local` sweep (each job its own process, as
on SLURM) lands under one MLflow parent run, and the two jobs share one generation pool without corrupting it."""

import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from conftest import REPO, tiny_overrides
from draftlab.config.config import validate
from draftlab.pipeline import plan
from draftlab.util.reporting import NullReporter
from draftlab.stages import generate

pytestmark = pytest.mark.slow


def test_submitit_local_sweep_lands_under_one_parent_and_shares_the_pool(tmp_path, tiny_cfg):
    overrides = [o for o in tiny_overrides(tmp_path) if not o.startswith("data.samples")]
    result = subprocess.run(
        [sys.executable, str(REPO / "src" / "run.py"), "-m", "hydra/launcher=submitit_local",
         "hydra.launcher.timeout_min=10", *overrides, "data.samples=16,32", "bench.tau_fail=0.0",
         f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        capture_output=True, text=True, timeout=900, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("draftlab").experiment_id])
    parents = [r for r in runs if r.data.tags.get("draftlab.role") == "sweep"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert sorted(int(c.data.params["data.samples"]) for c in children) == [16, 32]
    assert all(c.info.status == "FINISHED" for c in children)
    definition = client.download_artifacts(parents[0].info.run_id, "sweep/definition.yaml", str(tmp_path))
    assert "LocalLauncher" in open(definition).read()  # the parent records which launcher ran the jobs
    # one pool, every sample generated once, byte-identical to a pool grown in one process
    new = sum(c.data.metrics["generate/new_samples"] for c in children)
    assert new == 32
    pool = plan(validate(tiny_cfg("data.samples=32")))["generate"].folder
    reference = tmp_path / "reference"
    generate.run(validate(tiny_cfg("data.samples=32")), reference, {}, NullReporter())
    shards = sorted(p.name for p in pool.glob("shard-*"))
    assert shards == sorted(p.name for p in reference.glob("shard-*"))
    assert all((pool / name).read_bytes() == (reference / name).read_bytes() for name in shards)


def test_a_submitit_job_with_two_tasks_trains_with_ddp_and_tracks_once(tmp_path):
    """tasks_per_node=2: submitit starts two processes for one job (as SLURM does for 2 GPUs); they train as
    DDP ranks and only rank 0 opens an MLflow run."""
    overrides = [o for o in tiny_overrides(tmp_path) if not o.startswith("data.samples")]
    result = subprocess.run(
        [sys.executable, str(REPO / "src" / "run.py"), "-m", "hydra/launcher=submitit_local",
         "hydra.launcher.tasks_per_node=2", "hydra.launcher.timeout_min=10", *overrides, "data.samples=32",
         "stages=[generate,extract,train]", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        capture_output=True, text=True, timeout=900, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    logs = "".join(p.read_text() for p in (tmp_path / "sweep" / ".submitit").glob("*/*_log.*"))
    assert "ddp over 2 processes (rank 0)" in logs and "ddp over 2 processes (rank 1)" in logs
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("draftlab").experiment_id])
    children = [r for r in runs if r.data.tags.get("draftlab.role") != "sweep"]
    assert len(children) == 1 and children[0].info.status == "FINISHED"
