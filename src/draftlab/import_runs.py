"""`python -m draftlab import-runs <folder>`: bring jobs that ran with `tracking.enabled=false` (on a GPU machine
with no route to the tracking store, say) into MLflow. Each Hydra job folder holds a `results.json`; a multirun
folder becomes one parent run with a child per job, so `src/analyze.py` and the MLflow UI treat it as a sweep.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftlab.tracking import MlflowReporter, _client, experiment_id, tracking_uri


def import_runs(folder: Path, experiment: str, uri: str | None = None) -> str:
    """Logs every results.json under `folder`; returns the parent run's id."""
    from mlflow.entities import Param

    files = sorted(Path(folder).rglob("results.json"))
    if not files:
        raise FileNotFoundError(f"{folder}: no results.json (were the jobs run with src/run.py?)")
    records = []
    for file in files:
        try:
            record = json.loads(file.read_text())
        except ValueError as err:
            raise ValueError(f"{file}: invalid JSON ({err})") from None
        if not isinstance(record, dict) or not {"params", "metrics"} <= set(record):
            raise ValueError(f"{file}: not a draftlab results.json (needs params and metrics)")
        records.append((file, record))
    uri = tracking_uri(uri)
    client = _client(uri)
    exp = experiment_id(client, experiment, uri)
    parent = client.create_run(exp, run_name=f"import-{Path(folder).name}",
                               tags={"draftlab.role": "sweep", "draftlab.imported_from": str(folder)}).info.run_id
    for file, record in records:
        tags = {**{k: str(v) for k, v in record.get("tags", {}).items()}, "mlflow.parentRunId": parent,
                "draftlab.imported_from": str(file.parent)}
        run_id = client.create_run(exp, run_name=file.parent.name, tags=tags).info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in sorted(record["params"].items())]
        for start in range(0, len(params), 100):
            client.log_batch(run_id, params=params[start:start + 100])
        MlflowReporter(client, run_id).metrics(record["metrics"])
        client.set_terminated(run_id, status="FINISHED")
    client.set_terminated(parent, status="FINISHED")
    return parent


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m draftlab import-runs", description=__doc__)
    parser.add_argument("folder", type=Path, help="a Hydra run or multirun folder")
    parser.add_argument("--experiment", required=True, help="MLflow experiment to log into")
    parser.add_argument("--tracking-uri", default=None)
    args = parser.parse_args(argv)
    parent = import_runs(args.folder, args.experiment, args.tracking_uri)
    print(f"imported into parent run {parent} (experiment {args.experiment})")
    return 0
