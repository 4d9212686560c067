"""MLflow tracking: one run per job, nested under a sweep's parent run, in a SQLite store under `mlruns/`.

Everything goes through `MlflowClient` with explicit run ids rather than MLflow's fluent global run, so a
sweep's parent and its children can live in different processes (any Hydra launcher) and stage code only ever
sees a `Reporter`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Iterator

from omegaconf import OmegaConf

from draftlab.provenance.provenance import git_state, package_versions
from draftlab.tracking.run_context import PARENT_ID_FILE, flatten, job_key, process_identity, repo_root, tracking_uri

log = logging.getLogger("draftlab.tracking.runs")

RETRY_EVERY_S = 30.0  # how often a run retries a failing store (MlflowReporter)


def _client(uri: str):
    """The client for `uri`, its store checked and (for SQLite) created under a lock."""
    return open_store(uri)


@functools.lru_cache(maxsize=None)
def open_store(uri: str, timeout: float | None = None):
    """An MlflowClient for `uri` whose store answered (and, for SQLite, exists with its tables).
    Raises StoreError naming `tracking.uri`: at once for a dead server or an unwritable SQLite file, and after
    `timeout` seconds for a remote store that does not answer."""
    from mlflow.tracking import MlflowClient  # imported before any clock starts: the import alone takes seconds

    from draftlab.util.fsutil import file_lock
    from draftlab.tracking.store import (HINT, STORE_TIMEOUT_S, StoreError, call_with_timeout, check_reachable,
                                         sqlite_path)

    check_reachable(uri)

    def open_client():
        client = MlflowClient(tracking_uri=uri)
        client.search_experiments(max_results=1)  # instantiates the store: a fresh SQLite file gets its tables
        return client

    path = sqlite_path(uri)
    if path is None:
        return call_with_timeout("the tracking store", uri, open_client, timeout or STORE_TIMEOUT_S)
    # Local and checked writable above, so no timeout: creating a fresh store's tables takes several seconds.
    try:
        with file_lock(path.with_name(path.name + ".lock")):
            return open_client()
    except OSError as err:
        raise StoreError(f"tracking.uri: cannot lock the SQLite store {path} ({err}); {HINT}") from None


# How MLflow 3.x's UI decides what an experiment is: the experiment tag `mlflow.experimentKind`
# (values of its ExperimentKind enum in mlflow/server/js: genai_development, custom_model_development, ...).
# Without it, 3.17 infers the kind and opened ours on the GenAI overview (traces, sessions).
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def experiment_id(client, name: str, uri: str) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.tags.get("mlflow.experimentKind") is None:  # made before draftlab set the kind
            client.set_experiment_tag(experiment.experiment_id, *next(iter(EXPERIMENT_KIND.items())))
        return experiment.experiment_id
    location = None
    if uri.startswith("sqlite:///"):
        # Keep artifacts beside the database, not wherever the first run happened to start.
        location = (Path(uri[len("sqlite:///"):]).parent / "artifacts" / name).as_uri()
    try:
        return client.create_experiment(name, artifact_location=location, tags=EXPERIMENT_KIND)
    except Exception:  # another process may have created it first; anything else is re-raised
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


class MlflowReporter:
    """The Reporter that stage code sees: it writes to one run through the client.

    A store that fails mid-run (a full disk, a server restart) must not kill hours of training: what cannot be
    logged is kept, a warning says so once, and everything kept is retried, in order, at the next log point and
    when the run ends (`flush`)."""

    def __init__(self, client, run_id: str, experiment_id: str | None = None):
        self.client, self.run_id, self.experiment_id = client, run_id, experiment_id
        self.tags: dict[str, str] = {}
        self.pending: list = []  # (kind, payload) not yet in the store, oldest first
        self.failing = False
        self.retry_at = 0.0  # while failing, a store that hangs must not stall every log point: back off

    def metrics(self, values: dict[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step or 0) for k, v in values.items() if _is_number(v)]
        for start in range(0, len(batch), 500):
            self.pending.append(("metrics", batch[start:start + 500]))
        self.flush()

    def artifact(self, path: Path, subdir: str | None = None) -> None:
        self.pending.append(("artifact", (Path(path), subdir)))
        self.flush()

    def tag(self, key: str, value: str) -> None:
        self.tags[key] = str(value)
        self.pending.append(("tag", (key, str(value)[:5000])))
        self.flush()

    def flush(self, force: bool = False) -> bool:
        """Sends what is kept; True when nothing is left. Never raises: the store's fault is logged. While the
        store fails, it is tried again at most every RETRY_EVERY_S seconds, unless `force` (the run's end)."""
        if self.failing and not force and time.monotonic() < self.retry_at:
            return False
        while self.pending:
            kind, payload = self.pending[0]
            try:
                self._send(kind, payload)
            except Exception as err:  # noqa: BLE001 - any store fault; the work must go on
                if not self.failing:
                    log.warning("tracking: could not log to run %s (%s: %s); keeping %s and retrying at the next "
                                "log point", self.run_id, type(err).__name__, str(err).splitlines()[0] if str(err)
                                else "", kind)
                self.failing = True
                self.retry_at = time.monotonic() + RETRY_EVERY_S
                return False
            self.pending.pop(0)
        if self.failing:
            log.warning("tracking: the store answers again; everything kept is now logged to run %s", self.run_id)
        self.failing = False
        return True

    def _send(self, kind: str, payload) -> None:
        if kind == "metrics":
            self.client.log_batch(self.run_id, metrics=payload)
        elif kind == "tag":
            self.client.set_tag(self.run_id, *payload)
        elif kind == "tags":
            self.client.log_batch(self.run_id, tags=payload)
        else:
            path, subdir = payload
            if path.is_dir():
                self.client.log_artifacts(self.run_id, str(path), artifact_path=subdir)
            else:
                self.client.log_artifact(self.run_id, str(path), artifact_path=subdir)

    def tag_many(self, tags: dict[str, str]) -> None:
        """Several tags in one call: one transaction instead of one per tag (12 tags: 0.37 s -> 0.04 s); kept and
        retried like everything else when the store fails."""
        from mlflow.entities import RunTag

        self.tags.update({k: str(v) for k, v in tags.items()})
        self.pending.append(("tags", [RunTag(k, str(v)[:5000]) for k, v in tags.items()]))
        self.flush()


def _is_number(value) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return not isinstance(value, (bool, str))


def close_orphans(client, experiment: str, key: str) -> list[str]:
    """A killed job leaves its run RUNNING: the next run of the same job closes it (`_close_dead`)."""
    return _close_dead(client, experiment, f"tags.`draftlab.job` = '{key}'", "this job")


def close_dead_sweeps(client, experiment: str) -> list[str]:
    """A killed sweep leaves its parent run RUNNING: the next sweep in the experiment closes it (`_close_dead`)."""
    return _close_dead(client, experiment, "tags.`draftlab.role` = 'sweep'", "a sweep's parent")


def _owner_tags() -> dict[str, str]:
    """The host and process a run is started by: what `_close_dead` reads to tell a dead owner from a live one."""
    return {"draftlab.host": socket.gethostname(),
            "draftlab.process": process_identity(os.getpid()) or str(os.getpid())}


def _close_dead(client, experiment: str, which: str, what: str) -> list[str]:
    """RUNNING runs matching `which`, started on this host by a process that no longer lives, are closed as KILLED;
    returns their ids. Runs from other hosts, or without a process tag, are left alone (nothing here can tell
    whether they still run)."""
    host = socket.gethostname()
    runs = client.search_runs([experiment], f"{which} and attributes.status = 'RUNNING'", max_results=1000)
    closed = []
    for run in runs:
        tags = run.data.tags
        if tags.get("draftlab.host") != host or not tags.get("draftlab.process"):
            continue
        pid = int(tags["draftlab.process"].split(":")[0])
        if process_identity(pid) == tags["draftlab.process"]:
            continue  # still running (another copy of this job, or a sweep's parent process)
        client.set_tag(run.info.run_id, "draftlab.closed_as", "killed: its process died; a rerun closed it")
        client.set_terminated(run.info.run_id, status="KILLED")
        log.warning("tracking: run %s of %s was left RUNNING by a killed process; closed it as KILLED",
                    run.info.run_id, what)
        closed.append(run.info.run_id)
    return closed


@contextlib.contextmanager
def tracked_run(cfg, parent_run_id: str | None = None, tags: dict[str, str] | None = None) -> Iterator[MlflowReporter]:
    """Opens the job's run (a child when `parent_run_id` is given); marks it FAILED if the block raises.
    Runs of the same job that a killed process left RUNNING are closed as KILLED first."""
    uri = tracking_uri(cfg.tracking.uri)
    client = _client(uri)
    key = job_key(cfg)
    all_tags = {**git_state(repo_root()), **{f"version.{k}": v for k, v in package_versions().items()},
                "command": " ".join(sys.argv)[:5000], "draftlab.job": key, **_owner_tags(), **(tags or {})}
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    experiment = experiment_id(client, cfg.tracking.experiment, uri)
    close_orphans(client, experiment, key)
    run = client.create_run(experiment, run_name=cfg.tracking.run_name, tags=all_tags)
    run_id = run.info.run_id
    log.info("MLflow run %s in %s (experiment %s)", run_id, uri, cfg.tracking.experiment)
    reporter = MlflowReporter(client, run_id, experiment)
    with _ended(client, run_id, reporter):
        log_params(client, run_id, flatten(cfg))
        client.log_text(run_id, OmegaConf.to_yaml(cfg, resolve=True), "config/resolved.yaml")
        yield reporter


@contextlib.contextmanager
def _ended(client, run_id: str, reporter: MlflowReporter) -> Iterator[None]:
    """At the block's end: send what the reporter kept, then mark the run FINISHED, or FAILED if it raised."""
    try:
        yield
    except BaseException:
        reporter.flush(force=True)
        _terminate(client, run_id, "FAILED")
        raise
    if not reporter.flush(force=True):
        log.error("tracking: %d batches could not be logged to run %s; the job's results.json holds its final "
                  "metrics (python -m draftlab import-runs)", len(reporter.pending), run_id)
    _terminate(client, run_id, "FINISHED")


def _terminate(client, run_id: str, status: str) -> None:
    """Ends the run; a store that refuses leaves it RUNNING (a rerun closes it), never hides the job's result."""
    try:
        client.set_terminated(run_id, status=status)
    except Exception as err:  # noqa: BLE001
        log.error("tracking: could not mark run %s %s (%s)", run_id, status, err)


def start_parent_run(cfg, sweep_dir: Path, description: str, run_name: str | None = None) -> str:
    """Creates a sweep's parent run and leaves its id in the sweep folder for the jobs, whatever launches them."""
    uri = tracking_uri(cfg.tracking.uri)
    client = _client(uri)
    tags = {**git_state(repo_root()), "draftlab.sweep_dir": str(sweep_dir), "draftlab.role": "sweep",
            **_owner_tags()}
    experiment = experiment_id(client, cfg.tracking.experiment, uri)
    close_dead_sweeps(client, experiment)  # a killed sweep's parent would otherwise stay RUNNING for good
    run = client.create_run(experiment, run_name=run_name or cfg.tracking.run_name or f"sweep-{Path(sweep_dir).name}",
                            tags=tags)
    client.log_text(run.info.run_id, description, "sweep/definition.yaml")
    Path(sweep_dir).mkdir(parents=True, exist_ok=True)
    (Path(sweep_dir) / PARENT_ID_FILE).write_text(run.info.run_id)
    return run.info.run_id


def end_parent_run(cfg, run_id: str, failed: bool = False) -> None:
    end_run(open_client(cfg.tracking.uri), run_id, failed)


# ---------------------------------------------------------------------------------------------------------------
# Client-level helpers for the other drivers (DVC stages, import-runs, sweeps, the analysis), so that this module
# is the only one that imports mlflow (tests/integration/test_tracking_boundary.py checks it); reading runs back,
# which needs no mlflow import, is in run_queries.py.
# ---------------------------------------------------------------------------------------------------------------

def open_client(uri: str | None = None):
    """An MlflowClient on `uri`, resolved as `tracking_uri` resolves it."""
    return _client(tracking_uri(uri))


def log_params(client, run_id: str, params: dict) -> None:
    """Params in batches of 100 (MLflow's limit per call), values cut to MLflow's 6000 characters."""
    from mlflow.entities import Param

    batch = [Param(k, str(v)[:6000]) for k, v in sorted(params.items())]
    for start in range(0, len(batch), 100):
        client.log_batch(run_id, params=batch[start:start + 100])


def get_run(client, run_id: str):
    """The run, or None when this store has no run with that id."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException:
        return None


def log_metrics(client, run_id: str, metrics: dict, step: int | None = None, timestamp: int | None = None) -> None:
    log_points(client, run_id, [(k, v, step or 0) for k, v in metrics.items()], timestamp)


def log_points(client, run_id: str, points: list[tuple[str, float, int]], timestamp: int | None = None) -> None:
    """(key, value, step) points, numeric values only, in batches of 500 (MLflow's limit per call)."""
    from mlflow.entities import Metric

    now = timestamp or int(time.time() * 1000)
    batch = [Metric(k, float(v), now, int(s)) for k, v, s in points if _is_number(v)]
    for start in range(0, len(batch), 500):
        client.log_batch(run_id, metrics=batch[start:start + 500])


def log_analysis(client, run_id: str, numbers: dict, tags: dict[str, str], texts: dict[str, str],
                 files: list[tuple[str, Path]]) -> None:
    """The analysis onto a sweep's parent: metrics, tags, text artifacts (name -> content) and files
    ((artifact folder, path) pairs)."""
    log_metrics(client, run_id, numbers)
    for key, value in tags.items():
        client.set_tag(run_id, key, str(value)[:5000])
    for name, text in texts.items():
        client.log_text(run_id, text, name)
    for folder, path in files:
        client.log_artifact(run_id, str(path), artifact_path=folder)


def find_run(cfg, tags: dict[str, str]) -> str | None:
    """The newest run of the configured experiment that carries every tag in `tags`."""
    uri = tracking_uri(cfg.tracking.uri)
    client = _client(uri)
    condition = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
    runs = client.search_runs([experiment_id(client, cfg.tracking.experiment, uri)], filter_string=condition,
                              max_results=1, order_by=["attributes.start_time DESC"])
    return runs[0].info.run_id if runs else None


@contextlib.contextmanager
def reopened_run(cfg, run_id: str) -> Iterator[MlflowReporter]:
    """Logs into an existing run (the next DVC stage of the same `dvc repro`), then closes it again."""
    client = _client(tracking_uri(cfg.tracking.uri))
    client.update_run(run_id, status="RUNNING")
    # this process now owns the run: close_orphans must not take the first stage's (ended) pid for a dead job
    identity = process_identity(os.getpid())
    if identity:
        client.set_tag(run_id, "draftlab.process", identity)
    reporter = MlflowReporter(client, run_id)
    with _ended(client, run_id, reporter):
        yield reporter


def import_job(client, experiment: str, run_name: str, params: dict, metrics: dict, tags: dict[str, str],
               history: dict | None = None) -> str:
    """One finished run made from a job's results.json (`python -m draftlab import-runs`); returns its id.
    `history` ({key: [[step, value], ...]}) is logged step by step; the final metrics come at its last step, as a
    tracked job logs them, so MLflow shows them as each key's latest value."""
    run_id = create_run(client, experiment, run_name, tags)
    log_params(client, run_id, params)
    points = [(key, value, step) for key, pairs in (history or {}).items() for step, value in pairs]
    now = int(time.time() * 1000)
    log_points(client, run_id, points, now)
    log_metrics(client, run_id, metrics, step=max((s for *_, s in points), default=0), timestamp=now + 1)
    client.set_terminated(run_id, status="FINISHED")
    return run_id


def create_run(client, experiment: str, run_name: str, tags: dict[str, str]) -> str:
    """A bare run (import-runs' parent), left RUNNING for the caller to close with `end_run`."""
    return client.create_run(experiment_id(client, experiment, client.tracking_uri), run_name=run_name,
                             tags=tags).info.run_id


def end_run(client, run_id: str, failed: bool = False) -> None:
    client.set_terminated(run_id, status="FAILED" if failed else "FINISHED")
