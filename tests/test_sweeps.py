"""A tiny end-to-end data-scaling sweep: one MLflow parent, a child per job, shared generation, a verdict."""

import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from conftest import REPO, tiny_overrides

pytestmark = pytest.mark.slow


def test_data_scaling_sweep_on_tiny_target(tmp_path):
    overrides = [o for o in tiny_overrides(tmp_path) if not o.startswith(("data.samples", "train.epochs"))]
    result = subprocess.run(
        [sys.executable, str(REPO / "src" / "run.py"), "-m", "experiment=data_scaling", *overrides,
         "data.samples=24,12", "train.seed=0", "train.epochs=1", "bench.tau_fail=0.0",
         f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        capture_output=True, text=True, timeout=1200, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("data_scaling")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get("draftlab.role") == "sweep"]
    assert len(parents) == 1
    parent = parents[0]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(int(c.data.params["data.samples"]) for c in children) == [12, 24]
    assert all(c.info.status == "FINISHED" for c in children)
    # runs are named after what the sweep varies (train.seed is pinned on the command line, so it does not)
    assert sorted(c.info.run_name for c in children) == ["samples=12", "samples=24"]
    assert parent.info.run_name == "sweep samples"
    assert "sweep summary (2 jobs)" in result.stdout + result.stderr and "samples=24" in result.stdout + result.stderr
    # the largest N ran first and generated the pool; the smaller job read a prefix of it
    by_n = {int(c.data.params["data.samples"]): c.data.metrics for c in children}
    assert by_n[24]["generate/new_samples"] > 0 and by_n[12]["generate/new_samples"] == 0
    assert parent.data.metrics["sweep/samples_generated"] == by_n[24]["generate/new_samples"]
    assert parent.data.tags["verdict"] == "undetermined"  # two points cannot tell
    artifacts = [a.path for a in client.list_artifacts(parent.info.run_id, "analysis")]
    assert "analysis/report.md" in artifacts
    assert parent.info.status == "FINISHED"
