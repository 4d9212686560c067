"""Two runs at once (issue 14 part 3): on a fresh SQLite store both finish, and each keeps its own Hydra folder
(run.log and results.json), even when started in the same second."""

import os
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from conftest import REPO, tiny_overrides

pytestmark = pytest.mark.slow


def test_two_identical_runs_at_once_on_a_fresh_store(tmp_path):
    command = [sys.executable, str(REPO / "src" / "run.py"), *tiny_overrides(tmp_path, "stages=[generate]",
                                                                             "data.samples=8")]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "DRAFTLAB_PROGRESS": "0"}
    jobs = [subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for _ in range(2)]
    outputs = [job.communicate(timeout=600)[0] for job in jobs]
    for job, output in zip(jobs, outputs):
        assert job.returncode == 0, output[-3000:]

    folders = sorted((tmp_path / "out" / "runs").iterdir())
    assert len(folders) == 2  # one Hydra folder per job, though both started in the same second
    for folder in folders:
        assert (folder / "results.json").exists() and (folder / "run.log").exists()
        log = (folder / "run.log").read_text()
        assert log.count("MLflow run ") == 1 and "run summary" in log  # one job's log, not two interleaved

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("draftlab").experiment_id])
    assert sorted(r.info.status for r in runs) == ["FINISHED", "FINISHED"]
