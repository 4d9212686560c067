"""Two runs at once: on a fresh SQLite store both finish, and each keeps its own Hydra folder
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


def test_hydra_folders_are_unique_per_process(tmp_path):
    """Two jobs started in the same second (the race above, when the machine is fast enough) still get two
    folders: the names end in microseconds and the process id."""
    import importlib.util
    import re

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    spec = importlib.util.spec_from_file_location("draftlab_run_cli", REPO / "src" / "run.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))  # registers the draftlab.pid resolver
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"paths.root={tmp_path}"], return_hydra_config=True)
    for folder in (cfg.hydra.run.dir, cfg.hydra.sweep.dir):
        name = str(folder).rsplit("/", 1)[1]
        assert re.fullmatch(rf"\d{{4}}-\d\d-\d\d_\d\d-\d\d-\d\d\.\d{{6}}-{os.getpid()}", name), name
    # the jobs of one sweep: a subfolder each
    assert OmegaConf.to_container(cfg.hydra.sweep, resolve=False)["subdir"] == "${hydra.job.num}"


OPEN_AT = """
import sys, time
from draftlab.tracking.runs import open_store
from mlflow.tracking import MlflowClient  # imported before the start line, so all four open at once
while time.time() < float(sys.argv[2]):
    time.sleep(0.001)
open_store(sys.argv[1])
print("opened")
"""


def test_first_opens_of_a_fresh_store_at_once_all_succeed(tmp_path):
    """Plain MLflow clients opening a fresh SQLite file at once race in its table creation (tried here: 3 of 4
    failed with `table runs already exists` and the like, and the store stayed broken); open_store's lock
    serialises them."""
    import time

    (tmp_path / "fresh").mkdir()
    uri = f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}"
    start = time.time() + 15  # every process has imported MLflow by then
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    jobs = [subprocess.Popen([sys.executable, "-c", OPEN_AT, uri, str(start)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(4)]
    for job in jobs:
        out, err = job.communicate(timeout=300)
        assert job.returncode == 0 and out.strip() == "opened", err[-2000:]
    client = MlflowClient(tracking_uri=uri)
    assert client.create_experiment("after") and client.get_experiment_by_name("after")  # the store works
