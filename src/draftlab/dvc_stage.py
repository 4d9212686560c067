"""`python -m draftlab stage <name>`: one stage as a DVC command, on the config DVC composed into params.yaml.

DVC decides what to rerun; this only loads params.yaml (no Hydra, as DVC's docs advise for stage code), calls the
same stage function as src/run.py, writes the metrics file `dvc exp show` reads, and logs into one MLflow run per
distinct params.yaml, so the stages of one `dvc exp run` land in a single run.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import time
from pathlib import Path

from omegaconf import OmegaConf

from draftlab.config import validate
from draftlab.fsutil import atomic_write_json
from draftlab.pipeline import final_step
from draftlab.provenance import file_sha256
from draftlab.tracking import MlflowReporter, _client, experiment_id, tracked_run, tracking_uri

log = logging.getLogger("draftlab.dvc")
METRICS_DIR = Path("dvc_metrics")  # tracked by git (not under the ignored dvcout/) so `dvc exp show` sees it


def _existing_run(cfg, key: str) -> str | None:
    uri = tracking_uri(cfg.tracking.uri)
    client = _client(uri)
    runs = client.search_runs([experiment_id(client, cfg.tracking.experiment, uri)],
                              filter_string=f"tags.`draftlab.dvc_key` = '{key}'", max_results=1,
                              order_by=["attributes.start_time DESC"])
    return runs[0].info.run_id if runs else None


def run_dvc_stage(name: str, params: Path, out: Path, inputs: dict[str, Path]) -> dict[str, float]:
    cfg = validate(OmegaConf.load(params))
    if cfg.train.init_from == "shorter":
        # DVC keeps one train folder, so there is no shorter run beside it: train from scratch.
        log.warning("train.init_from=shorter has no meaning under DVC; training from scratch")
        cfg = OmegaConf.merge(cfg, {"train": {"init_from": None}})
    from draftlab.task import preflight

    preflight(cfg)
    module = importlib.import_module(f"draftlab.stages.{name}")
    key = file_sha256(params)[:16]

    def work(reporter) -> dict[str, float]:
        started = time.perf_counter()
        out.mkdir(parents=True, exist_ok=True)
        metrics = dict(module.run(cfg, out, inputs, reporter))
        metrics[f"{name}/seconds"] = time.perf_counter() - started
        reporter.metrics(metrics, step=final_step(metrics))
        atomic_write_json(METRICS_DIR / f"{name}.json", metrics)
        if name == "train":
            _write_curve(out / "manifest.json", METRICS_DIR / "train_curve.csv")
        return metrics

    if not cfg.tracking.enabled:
        from draftlab.reporting import NullReporter

        return work(NullReporter())
    run_id = _existing_run(cfg, key)
    if run_id is None:
        with tracked_run(cfg, tags={"draftlab.dvc_key": key, "draftlab.driver": "dvc"}) as reporter:
            return work(reporter)
    client = _client(tracking_uri(cfg.tracking.uri))
    client.update_run(run_id, status="RUNNING")
    try:
        metrics = work(MlflowReporter(client, run_id))
    except BaseException:
        client.set_terminated(run_id, status="FAILED")
        raise
    client.set_terminated(run_id, status="FINISHED")
    return metrics


def _write_curve(manifest: Path, path: Path) -> None:
    """Per-epoch validation curves in the CSV form `dvc plots` reads."""
    import csv
    import io
    import json

    history = json.loads(manifest.read_text()).get("history", [])
    columns = sorted({key for entry in history for key in entry} - {"epoch", "step"})
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["epoch", "step", *[c.replace("/", "_") for c in columns]])
    for entry in history:
        writer.writerow([entry.get("epoch"), entry.get("step"), *[entry.get(c, "") for c in columns]])
    from draftlab.fsutil import atomic_write_text

    atomic_write_text(path, buffer.getvalue())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m draftlab stage", description=__doc__)
    parser.add_argument("name", choices=["generate", "extract", "train", "bench"])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--in", dest="inputs", action="append", default=[], metavar="STAGE=DIR")
    args = parser.parse_args(argv)
    inputs = {}
    for item in args.inputs:
        stage, _, folder = item.partition("=")
        if not folder:
            parser.error(f"--in {item}: expected STAGE=DIR")
        inputs[stage] = Path(folder)
    run_dvc_stage(args.name, args.params, args.out, inputs)
    return 0
