"""`python -m draftlab import-runs <folder>`: bring jobs that ran with `tracking.enabled=false` (on a GPU machine
with no route to the tracking store, say) into MLflow. Each Hydra job folder holds a `results.json`; a multirun
folder becomes one parent run with a child per job, so `src/analyze.py` and the MLflow UI treat it as a sweep.
The metrics a job logged at a step (its "history": validation passes, train/bench_tau) are logged step by step, so
its curves show in the MLflow UI as a tracked job's do.
`--records FILE` also writes them as one records file (`src/analyze.py --records`), small enough to commit beside
the report it makes, each run named by its job folder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from draftlab.util.cli_parser import ArgumentParser
from draftlab.analysis.records import write_records
from draftlab.tracking.runs import create_run, end_run, import_job, log_analysis, open_client


def import_runs(folder: Path, experiment: str, uri: str | None = None, records: Path | None = None) -> str:
    """Logs every results.json under `folder` (and writes them to `records`, when given); returns the parent run's
    id."""
    files = sorted(Path(folder).rglob("results.json"))
    if not files:
        raise FileNotFoundError(f"{folder}: no results.json (were the jobs run with src/run.py?)")
    found = []
    for file in files:  # every file is checked before the first run is created
        try:
            record = json.loads(file.read_text())
        except ValueError as err:
            raise ValueError(f"{file}: invalid JSON ({err})") from None
        if not isinstance(record, dict) or not {"params", "metrics"} <= set(record):
            raise ValueError(f"{file}: not a draftlab results.json (needs params and metrics)")
        _check_history(file, record.get("history", {}))
        found.append((file, record))
    if records is not None:
        write_records(records, [{"run_id": file.parent.relative_to(folder).as_posix(), **record}
                                for file, record in found])
    client = open_client(uri)
    parent = create_run(client, experiment, f"import-{Path(folder).name}",
                        {"draftlab.role": "sweep", "draftlab.imported_from": str(folder)})
    try:
        for file, record in found:
            tags = {**{k: str(v) for k, v in record.get("tags", {}).items()}, "mlflow.parentRunId": parent,
                    "draftlab.imported_from": str(file.parent)}
            run_id = import_job(client, experiment, file.parent.name, record["params"], record["metrics"], tags,
                                record.get("history"))
            if record.get("val_samples"):  # as the tracked train stage logs them: an artifact of the run
                log_analysis(client, run_id, {}, {}, {"val_samples.json": json.dumps(record["val_samples"])}, [])
    except BaseException:
        end_run(client, parent, failed=True)
        raise
    end_run(client, parent)
    return parent


def _check_history(file: Path, history) -> None:
    """results.json's "history": {key: [[step, value], ...]}, the metrics an untracked job logged at a step."""
    if not isinstance(history, dict):
        raise ValueError(f"{file}: history is not a mapping of metric keys to [step, value] pairs")
    for key, pairs in history.items():
        if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], int)
                                                  for p in pairs):
            raise ValueError(f"{file}: history.{key} is not a list of [step, value] pairs")


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="python -m draftlab import-runs", description=__doc__)
    parser.add_argument("folder", type=Path, help="a Hydra run or multirun folder")
    parser.add_argument("--experiment", required=True, help="MLflow experiment to log into")
    parser.add_argument("--tracking-uri", default=None)
    parser.add_argument("--records", type=Path, default=None,
                        help="also write the records to this file for `src/analyze.py --records` (.gz: compressed)")
    args = parser.parse_args(argv)
    try:  # every results.json is read and checked before any run is created
        parent = import_runs(args.folder, args.experiment, args.tracking_uri, args.records)
    except (FileNotFoundError, ValueError) as err:
        print(f"import-runs: {str(err).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    print(f"imported into parent run {parent} (experiment {args.experiment})")
    return 0
