"""MLflow tracking: one run per job, nested under a sweep's parent run, in a SQLite store under `mlruns/`.

Everything goes through `MlflowClient` with explicit run ids rather than MLflow's fluent global run, so a
sweep's parent and its children can live in different processes (any Hydra launcher) and stage code only ever
sees a `Reporter`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from pathlib import Path
from typing import Iterator

from omegaconf import OmegaConf

from draftlab.provenance import git_state, package_versions

log = logging.getLogger("draftlab.tracking")

PARENT_ID_FILE = "mlflow_parent_run_id"


def repo_root(start: Path | None = None) -> Path:
    """The project folder (the one holding conf/). Inside a queued `dvc exp run` the work happens in a copy
    under .dvc/tmp/exps/; runs must still land in the real repository's store, so the copy is seen through."""
    here = Path(start or Path.cwd()).resolve()
    parts = here.parts
    if ".dvc" in parts:
        return Path(*parts[: parts.index(".dvc")])
    for folder in (here, *here.parents):
        if (folder / "conf" / "config.yaml").exists():
            return folder
    return here


def tracking_uri(configured: str | None = None) -> str:
    """`tracking.uri`, else MLFLOW_TRACKING_URI, else sqlite:///<repo>/mlruns/mlflow.db (absolute)."""
    if configured:
        return configured
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    store = repo_root() / "mlruns"
    store.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{store / 'mlflow.db'}"


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def experiment_id(client, name: str, uri: str) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    location = None
    if uri.startswith("sqlite:///"):
        # Keep artifacts beside the database, not wherever the first run happened to start.
        location = (Path(uri[len("sqlite:///"):]).parent / "artifacts" / name).as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except Exception:  # another process may have created it first; anything else is re-raised
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def flatten(cfg) -> dict[str, str]:
    container = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else cfg
    flat: dict[str, str] = {}

    def walk(node, prefix):
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            flat[prefix[:-1]] = str(node)[:6000]

    walk(container, "")
    return flat


class MlflowReporter:
    """The Reporter that stage code sees: it writes to one run through the client."""

    def __init__(self, client, run_id: str):
        self.client, self.run_id = client, run_id
        self.tags: dict[str, str] = {}

    def metrics(self, values: dict[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step or 0) for k, v in values.items() if _is_number(v)]
        for start in range(0, len(batch), 500):
            self.client.log_batch(self.run_id, metrics=batch[start:start + 500])

    def artifact(self, path: Path, subdir: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path=subdir)
        else:
            self.client.log_artifact(self.run_id, str(path), artifact_path=subdir)

    def tag(self, key: str, value: str) -> None:
        self.tags[key] = str(value)
        self.client.set_tag(self.run_id, key, str(value)[:5000])


def _is_number(value) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return not isinstance(value, (bool, str))


def _log_params(client, run_id: str, cfg) -> None:
    from mlflow.entities import Param

    params = [Param(k, v) for k, v in sorted(flatten(cfg).items())]
    for start in range(0, len(params), 100):
        client.log_batch(run_id, params=params[start:start + 100])


@contextlib.contextmanager
def tracked_run(cfg, parent_run_id: str | None = None, tags: dict[str, str] | None = None) -> Iterator[MlflowReporter]:
    """Opens the job's run (a child when `parent_run_id` is given); marks it FAILED if the block raises."""
    uri = tracking_uri(cfg.tracking.uri)
    client = _client(uri)
    all_tags = {**git_state(repo_root()), **{f"version.{k}": v for k, v in package_versions().items()},
                "command": " ".join(sys.argv)[:5000], **(tags or {})}
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    run = client.create_run(experiment_id(client, cfg.tracking.experiment, uri), run_name=cfg.tracking.run_name,
                            tags=all_tags)
    run_id = run.info.run_id
    log.info("MLflow run %s in %s (experiment %s)", run_id, uri, cfg.tracking.experiment)
    reporter = MlflowReporter(client, run_id)
    try:
        _log_params(client, run_id, cfg)
        client.log_text(run_id, OmegaConf.to_yaml(cfg, resolve=True), "config/resolved.yaml")
        yield reporter
    except BaseException:
        client.set_terminated(run_id, status="FAILED")
        raise
    client.set_terminated(run_id, status="FINISHED")


def start_parent_run(cfg, sweep_dir: Path, description: str) -> str:
    """Creates a sweep's parent run and leaves its id in the sweep folder for the jobs, whatever launches them."""
    uri = tracking_uri(cfg.tracking.uri)
    client = _client(uri)
    tags = {**git_state(repo_root()), "draftlab.sweep_dir": str(sweep_dir), "draftlab.role": "sweep"}
    run = client.create_run(experiment_id(client, cfg.tracking.experiment, uri),
                            run_name=cfg.tracking.run_name or f"sweep-{Path(sweep_dir).name}", tags=tags)
    client.log_text(run.info.run_id, description, "sweep/definition.yaml")
    Path(sweep_dir).mkdir(parents=True, exist_ok=True)
    (Path(sweep_dir) / PARENT_ID_FILE).write_text(run.info.run_id)
    return run.info.run_id


def end_parent_run(cfg, run_id: str, failed: bool = False) -> None:
    _client(tracking_uri(cfg.tracking.uri)).set_terminated(run_id, status="FAILED" if failed else "FINISHED")


def parent_run_id_for(sweep_dir: Path | None) -> str | None:
    if sweep_dir is None:
        return None
    path = Path(sweep_dir) / PARENT_ID_FILE
    return path.read_text().strip() if path.exists() else None
