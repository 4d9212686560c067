"""Sweep records from MLflow, and the analysis logged back onto the sweep's parent run.

A sweep is a parent run whose children carry the tag `mlflow.parentRunId` (draftlab.tracking writes both).
The source is either that parent's run id, or an experiment name, meaning the latest parent in it.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from mlflow.entities import Metric
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from draftlab.tracking import tracking_uri

PARENT_TAG = "mlflow.parentRunId"
# Metric histories worth fetching (one call per run and key): the curves, for readers of the records. The
# verdict reads convergence from train/steps and train/stopped_early instead (see analysis/axes.py).
HISTORY_KEYS = ("train/loss", "val/loss")
RUN_ID = re.compile(r"^[0-9a-f]{32}$")


@dataclass
class Sweep:
    parent_run_id: str
    experiment_id: str
    records: list[dict]
    skipped: list[str] = field(default_factory=list)  # "run_id (STATUS)" of children left out


def _search(client: MlflowClient, experiment_id: str, filter_string: str = "") -> list:
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], filter_string=filter_string, max_results=1000,
                                  page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def resolve_parent(client: MlflowClient, source: str) -> tuple[str, str]:
    """(parent run id, experiment id) for a run id or an experiment name (its latest run with children)."""
    if RUN_ID.match(source):
        try:
            run = client.get_run(source)
            return run.info.run_id, run.info.experiment_id
        except MlflowException:
            pass  # not a run here: maybe an experiment that happens to be named like one
    experiment = client.get_experiment_by_name(source)
    if experiment is None:
        raise ValueError(f"{source!r} is neither a run id nor an experiment name in this tracking store")
    runs = _search(client, experiment.experiment_id)
    parents = {r.data.tags.get(PARENT_TAG) for r in runs} - {None}
    candidates = [r for r in runs if r.info.run_id in parents]
    if not candidates:
        raise ValueError(f"experiment {source!r} has no sweep (no run with child runs)")
    latest = max(candidates, key=lambda r: r.info.start_time or 0)
    return latest.info.run_id, experiment.experiment_id


def load_records(source: str, uri: str | None = None, include_unfinished: bool = False,
                 history_keys: tuple[str, ...] = HISTORY_KEYS) -> Sweep:
    """The child runs of a sweep as analysis records (see `draftlab.analysis.records`).

    Failed or still-running children are left out (listed in `skipped`) unless `include_unfinished`.
    """
    client = MlflowClient(tracking_uri=tracking_uri(uri))
    parent_id, experiment_id = resolve_parent(client, source)
    children = _search(client, experiment_id, f"tags.`{PARENT_TAG}` = '{parent_id}'")
    records, skipped = [], []
    for run in sorted(children, key=lambda r: r.info.start_time or 0):
        if run.info.status != "FINISHED" and not include_unfinished:
            skipped.append(f"{run.info.run_id} ({run.info.status})")
            continue
        history = {k: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)]
                   for k in history_keys if k in run.data.metrics}
        records.append({"run_id": run.info.run_id, "params": dict(run.data.params),
                        "metrics": dict(run.data.metrics), "history": history,
                        "tags": {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")}})
    return Sweep(parent_id, experiment_id, records, skipped)


def log_to_parent(parent_run_id: str, result, uri: str | None = None) -> None:
    """Logs `analysis/*` metrics, the `verdict` tag and the report + plots (under artifacts `analysis/`)."""
    client = MlflowClient(tracking_uri=tracking_uri(uri))
    now = int(time.time() * 1000)
    batch = [Metric(k, float(v), now, 0) for k, v in sorted(result.numbers.items())]
    for start in range(0, len(batch), 500):
        client.log_batch(parent_run_id, metrics=batch[start:start + 500])
    client.set_tag(parent_run_id, "verdict", result.tag)
    client.set_tag(parent_run_id, "verdict.headline", result.headline[:5000])
    client.log_text(parent_run_id, result.report, "analysis/report.md")
    for name, path in result.paths.items():
        if Path(path).suffix == ".png":
            client.log_artifact(parent_run_id, str(path), artifact_path="analysis")
