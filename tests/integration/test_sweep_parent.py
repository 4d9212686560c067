"""A killed sweep leaves its parent run RUNNING; the next sweep in the experiment closes it as KILLED (issue 10)."""

import os
import signal
import subprocess
import sys

from mlflow.tracking import MlflowClient

from conftest import REPO
from draftlab.config.config import validate
from draftlab.tracking.runs import start_parent_run

# A sweep's first process: it opens the parent run, then dies without reaching on_multirun_end.
KILLED_SWEEP = """
import os, signal
from conftest import compose_config, tiny_overrides
from pathlib import Path
from draftlab.config.config import validate
from draftlab.tracking.runs import start_parent_run
cfg = validate(compose_config(tiny_overrides(Path({tmp!r}))))
start_parent_run(cfg, Path({tmp!r}) / "sweep0", "killed sweep")
os.kill(os.getpid(), signal.SIGKILL)
"""


def _parents(uri):
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("draftlab")
    runs = client.search_runs([exp.experiment_id], "tags.`draftlab.role` = 'sweep'",
                              order_by=["attributes.start_time ASC"])
    return client, runs


def test_the_next_sweep_closes_a_killed_sweeps_parent(tiny_cfg, tmp_path):
    killed = subprocess.run([sys.executable, "-c", KILLED_SWEEP.format(tmp=str(tmp_path))], cwd=REPO / "tests",
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO / 'tests'}"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    cfg = validate(tiny_cfg())
    uri = str(cfg.tracking.uri)
    client, runs = _parents(uri)
    assert [r.info.status for r in runs] == ["RUNNING"]
    dead = runs[0].info.run_id
    # a parent from another machine may still be running there: it is left alone
    foreign_tags = {"draftlab.role": "sweep", "draftlab.host": "elsewhere", "draftlab.process": "1:1"}
    foreign = client.create_run(runs[0].info.experiment_id, tags=foreign_tags).info.run_id

    live = start_parent_run(cfg, tmp_path / "sweep1", "next sweep")
    assert client.get_run(dead).info.status == "KILLED"
    assert "killed" in client.get_run(dead).data.tags["draftlab.closed_as"]
    assert client.get_run(foreign).info.status == "RUNNING"
    start_parent_run(cfg, tmp_path / "sweep2", "a sweep beside it")  # this process lives: its parent stays open
    assert client.get_run(live).info.status == "RUNNING"
