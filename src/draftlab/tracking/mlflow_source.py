"""Sweep records from MLflow, and the analysis logged back onto the sweep's parent run.

A sweep is a parent run whose children carry the tag `mlflow.parentRunId` (draftlab.tracking.runs writes both).
The source is either that parent's run id, or an experiment name, meaning the latest parent in it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from draftlab.tracking.run_queries import find_experiment_id, metric_history, search_runs
from draftlab.tracking.runs import get_run, log_analysis, open_client

PARENT_TAG = "mlflow.parentRunId"
# Metric histories worth fetching (one call per run and key): the curves, for readers of the records. The
# verdict reads convergence from train/steps and train/stopped_early instead (see analysis/axes.py).
HISTORY_KEYS = ("train/loss", "val/loss", "train/bench_tau")
VAL_SAMPLES = "val_samples.json"  # the train stage's per-sample validation results (train/per_sample.py)
RUN_ID = re.compile(r"^[0-9a-f]{32}$")
MAX_TAG = 5000  # MLflow's limit on a tag value; analysis/answer.md holds the whole text


@dataclass
class Sweep:
    parent_run_id: str
    experiment_id: str
    records: list[dict]
    skipped: list[str] = field(default_factory=list)  # "run_id (STATUS)" of children left out


def resolve_parent(client, source: str) -> tuple[str, str]:
    """(parent run id, experiment id) for a run id or an experiment name (its latest run with children)."""
    if RUN_ID.match(source):
        run = get_run(client, source)
        if run is not None:  # else maybe an experiment that happens to be named like a run id
            return run.info.run_id, run.info.experiment_id
    experiment_id = find_experiment_id(client, source)
    if experiment_id is None:
        raise ValueError(f"{source!r} is neither a run id nor an experiment name in this tracking store")
    runs = search_runs(client, [experiment_id])
    parents = {r.data.tags.get(PARENT_TAG) for r in runs} - {None}
    candidates = [r for r in runs if r.info.run_id in parents]
    if not candidates:
        raise ValueError(f"experiment {source!r} has no sweep (no run with child runs)")
    latest = max(candidates, key=lambda r: r.info.start_time or 0)
    return latest.info.run_id, experiment_id


def load_records(source: str, uri: str | None = None, include_unfinished: bool = False,
                 history_keys: tuple[str, ...] = HISTORY_KEYS) -> Sweep:
    """The child runs of a sweep as analysis records (see `draftlab.analysis.records`).

    Failed or still-running children are left out (listed in `skipped`) unless `include_unfinished`.
    """
    existing_store(uri)
    client = open_client(uri)
    parent_id, experiment_id = resolve_parent(client, source)
    children = search_runs(client, [experiment_id], f"tags.`{PARENT_TAG}` = '{parent_id}'")
    records, skipped = [], []
    for run in sorted(children, key=lambda r: r.info.start_time or 0):
        if run.info.status != "FINISHED" and not include_unfinished:
            skipped.append(f"{run.info.run_id} ({run.info.status})")
            continue
        history = {k: metric_history(client, run.info.run_id, k) for k in history_keys if k in run.data.metrics}
        records.append({"run_id": run.info.run_id, "params": dict(run.data.params),
                        "metrics": dict(run.data.metrics), "history": history,
                        "tags": {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")},
                        "val_samples": val_samples(run.data.tags.get("folder.train"), run.info.artifact_uri)})
    return Sweep(parent_id, experiment_id, records, skipped)


def existing_store(uri: str | None) -> None:
    """A SQLite store that does not exist holds no sweep: refused before MLflow would create it."""
    from draftlab.tracking.run_context import tracking_uri
    from draftlab.tracking.store import sqlite_path

    resolved = tracking_uri(uri)
    path = sqlite_path(resolved)
    if path is not None and not path.exists():
        raise ValueError(f"tracking store {path} does not exist, so it holds no sweep (run one first, or pass "
                         "--tracking-uri, or --records)")


def val_samples(train_folder: str | None, artifact_uri: str | None) -> dict | None:
    """A run's per-sample validation results: from its train stage folder when it is on this machine, else from
    its artifacts when they are local files (a file:// artifact store); None when neither holds them."""
    places = [Path(train_folder)] if train_folder else []
    if artifact_uri and urlparse(artifact_uri).scheme in ("", "file"):
        places.append(Path(unquote(urlparse(artifact_uri).path)))
    for folder in places:
        if (folder / VAL_SAMPLES).is_file():
            return json.loads((folder / VAL_SAMPLES).read_text())
    return None


def log_to_parent(parent_run_id: str, result, uri: str | None = None) -> None:
    """Logs `analysis/*` metrics, the `verdict` tag, the answer (tag `verdict.answer`, text `analysis/answer.md`:
    the report's first paragraph, as the sweep's terminal summary prints it) and the report + plots (under
    artifacts `analysis/`)."""
    answer = getattr(result, "answer", "") or result.headline
    log_analysis(open_client(uri), parent_run_id, numbers=dict(sorted(result.numbers.items())),
                 tags={"verdict": result.tag, "verdict.headline": result.headline,
                       "verdict.answer": answer[:MAX_TAG]},
                 texts={"analysis/report.md": result.report, "analysis/answer.md": answer},
                 files=[("analysis", Path(path)) for path in result.paths.values() if Path(path).suffix == ".png"])
