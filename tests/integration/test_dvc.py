"""The real `dvc repro` and `dvc exp run` in a temporary git repository, on the tiny target."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from conftest import REPO, compose_config, tiny_overrides
from draftlab.pipeline import STAGES

pytestmark = pytest.mark.slow


def test_dvc_yaml_params_match_what_each_stage_reads():
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for name, spec in STAGES.items():
        declared = set(stages[name]["params"])
        expected = set(spec.reads + spec.grows_with + spec.when_set)
        sections = {key for key in declared if "." not in key}
        covered = {key for key in expected if key in declared or key.split(".")[0] in sections}
        assert covered == expected, f"{name}: dvc.yaml params miss {expected - covered}"
        extra = {key for key in declared if key not in expected and not any(e.startswith(key + ".") for e in expected)}
        assert not extra, f"{name}: dvc.yaml lists params the stage does not read: {extra}"


def _sh(args, cwd, env):
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


@pytest.fixture
def dvc_repo(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    for item in ("conf", "src", "dvc.yaml", ".dvc/config", ".dvcignore", ".gitignore"):
        source = REPO / item
        (repo / item).parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, repo / item, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy(source, repo / item)
    overrides = tiny_overrides(tmp_path, "data.samples=8", "paths.root=outputs")
    (repo / "params.yaml").write_text(OmegaConf.to_yaml(compose_config(overrides)))
    # The stages run the repository's own copy of draftlab, so that editing it is what DVC sees.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONPATH": str(repo / "src"),
           "DVC_NO_ANALYTICS": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    _sh(["git", "init", "-q"], repo, env)
    _sh(["git", "add", "-A"], repo, env)
    _sh(["git", "commit", "-qm", "init"], repo, env)
    return repo, env, overrides


def test_repro_runs_generate_once_and_exp_run_composes_overrides(dvc_repo):
    repo, env, overrides = dvc_repo
    _sh(["dvc", "repro", "generate"], repo, env)
    metrics = json.loads((repo / "dvc_metrics/generate.json").read_text())
    assert metrics["generate/samples"] == 8
    second = _sh(["dvc", "repro", "generate"], repo, env)
    assert "didn't change" in second or "up to date" in second
    assert "Running stage" not in second

    # `dvc exp run -S` composes params.yaml from conf/ with Hydra's override grammar.
    sets = [arg for override in overrides if not override.startswith("data.samples")
            for arg in ("-S", override)]
    _sh(["dvc", "exp", "run", *sets, "-S", "data.samples=16", "generate"], repo, env)
    metrics = json.loads((repo / "dvc_metrics/generate.json").read_text())
    assert metrics["generate/samples"] == 16 and metrics["generate/new_samples"] == 8  # the pool grew by 8
    assert OmegaConf.load(repo / "params.yaml").data.samples == 16


def test_queued_experiments_log_into_the_repository_store(dvc_repo):
    """Queued experiments run in copies under .dvc/tmp/exps; their runs must still land in the repo's store."""
    import time

    from mlflow.tracking import MlflowClient

    repo, env, overrides = dvc_repo
    env = {k: v for k, v in env.items() if k != "MLFLOW_TRACKING_URI"}
    sets = [arg for override in overrides if not override.startswith(("data.samples", "tracking.uri"))
            for arg in ("-S", override)]
    _sh(["dvc", "exp", "run", "--queue", *sets, "-S", "data.samples=8,16", "generate"], repo, env)
    _sh(["dvc", "queue", "start", "--jobs", "1"], repo, env)
    deadline = time.time() + 500
    while time.time() < deadline:
        status = _sh(["dvc", "queue", "status"], repo, env)
        if "Queued" not in status and "Running" not in status:
            break
        time.sleep(3)
    assert "Success" in status and "Failed" not in status, status
    shown = _sh(["dvc", "exp", "show", "--no-pager", "--csv"], repo, env)
    assert "generate/samples" in shown

    client = MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlruns' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("draftlab").experiment_id])
    assert sorted(int(r.data.params["data.samples"]) for r in runs) == [8, 16]
    assert all(r.data.tags["draftlab.driver"] == "dvc" for r in runs)


def test_edited_train_code_reruns_train_and_bench_in_a_new_run(dvc_repo):
    """dvc.yaml lists each stage's code: after an edit to train/loop.py, `dvc repro` reruns train and bench
    only, and logs them into a new MLflow run tagged with the new commit, never into the first command's run."""
    from mlflow.tracking import MlflowClient

    repo, env, _ = dvc_repo
    first = _sh(["dvc", "repro"], repo, env)
    assert all(f"Running stage '{name}'" in first for name in STAGES), first
    loop = repo / "src/draftlab/train/loop.py"
    loop.write_text(loop.read_text() + "\n# an edit\n")
    _sh(["git", "commit", "-qam", "edit train"], repo, env)
    second = _sh(["dvc", "repro"], repo, env)
    ran = {name for name in STAGES if f"Running stage '{name}'" in second}
    assert ran == {"train", "bench"}, second

    client = MlflowClient(tracking_uri=OmegaConf.load(repo / "params.yaml").tracking.uri)
    runs = client.search_runs([client.get_experiment_by_name("draftlab").experiment_id],
                              order_by=["attributes.start_time ASC"])
    assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs)
    commits = [r.data.tags["git.commit"] for r in runs]
    assert commits[0] != commits[1]
    assert {"generate/seconds", "bench/seconds"} <= set(runs[0].data.metrics)
    assert "generate/seconds" not in runs[1].data.metrics and "bench/tau" in runs[1].data.metrics
