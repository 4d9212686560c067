"""Tiny end-to-end sweeps: one MLflow parent, a child per job, shared generation, a verdict."""

import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from conftest import REPO, tiny_overrides

pytestmark = pytest.mark.slow


def test_data_scaling_sweep_on_tiny_target(tmp_path):
    overrides = [o for o in tiny_overrides(tmp_path) if not o.startswith(("experiment=", "tracking.experiment="))]
    result = subprocess.run(
        [sys.executable, str(REPO / "src" / "run.py"), "-m", "experiment=[smoke,data_scaling]", *overrides,
         "data.samples=24,12", "train.seed=0", "train.epochs=1", "bench.tau_fail=0.0",
         f"hydra.sweep.dir={tmp_path / 'sweep'}", "train.max_steps=4", "train.eval_every=2"],  # converge: capped
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


def test_steps_vs_data_sweep_then_analysis_prices_both_axes(tmp_path):
    overrides = [o for o in tiny_overrides(tmp_path) if not o.startswith(("experiment=", "tracking.experiment="))]
    result = subprocess.run(
        [sys.executable, str(REPO / "src" / "run.py"), "-m", "experiment=[smoke,steps_vs_data]", *overrides,
         "data.samples=32,16,8", "train.max_steps=4,2", "train.eval_every=2", "stages=[generate,extract,train]",
         f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        capture_output=True, text=True, timeout=1200, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("steps_vs_data").experiment_id])
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    cells = sorted((int(c.data.params["data.samples"]), int(c.data.params["train.max_steps"])) for c in children)
    assert cells == sorted((n, s) for n in (8, 16, 32) for s in (2, 4))
    for c in children:  # the step budget replaced epochs, whatever the data size
        assert c.data.metrics["train/steps"] == float(c.data.params["train.max_steps"])
        assert c.data.metrics["train/stopped_early"] == 0.0 and c.data.metrics["train/epochs_seen"] > 0

    out = subprocess.run([sys.executable, str(REPO / "src" / "analyze.py"), "steps_vs_data", "--tracking-uri", uri,
                          "--out", str(tmp_path / "analysis"), "--boot", "100"],
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "2x steps (N=" in out.stdout and "2x data (S=4 steps)" in out.stdout, out.stdout[:3000]
    assert "| best/val_loss | steps |" in out.stdout and "| best/val_loss | data@steps |" in out.stdout
    assert (tmp_path / "analysis" / "steps_vs_data.png").exists()
    parent = next(r for r in runs if r.data.tags.get("draftlab.role") == "sweep")
    parent = client.get_run(parent.info.run_id)  # the sweep callback logged its analysis at the end
    assert parent.data.tags["verdict"] in ("under-trained", "data-limited", "joint", "undetermined",
                                           "bottleneck:capacity", "bottleneck:features", "bottleneck:unidentified")
    assert "analysis/loss_steps_gain_2x" in parent.data.metrics
    assert "analysis/loss_data_cost_2x_s" in parent.data.metrics
