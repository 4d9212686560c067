"""A Hydra callback that gives each multirun one MLflow parent run, whatever launcher runs the jobs.

The parent's id is left in the sweep folder (`run_context.PARENT_ID_FILE`); each job reads it and tags its own run
as a child. At the end the parent gets the analysis of its children (src/analyze.py).
"""

from __future__ import annotations

import logging
import sys
import os
import time
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from draftlab.config.config import ConfigError, validate
from draftlab.util.fsutil import read_json
from draftlab.tracking.run_names import short_names, sweep_keys, write_sweep_keys
from draftlab.tracking.summary import sweep_summary
from draftlab.tracking.run_context import parent_run_id_for, tracking_uri
from draftlab.tracking.run_queries import find_experiment_id
from draftlab.tracking.runs import end_parent_run, open_client, start_parent_run

log = logging.getLogger("draftlab.tracking.sweep")


class SweepCallback(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        if _follower():
            return
        task_cfg = validate({k: v for k, v in config.items() if k != "hydra"})
        sweep_dir = Path(config.hydra.sweep.dir)
        self.started = time.time()
        keys = sweep_keys(list(config.hydra.overrides.task), config.hydra.sweeper.get("params"))
        if not task_cfg.tracking.enabled:
            write_sweep_keys(sweep_dir, keys)  # each job names its run (results.json) after its values of these
            return
        definition = OmegaConf.to_yaml({"overrides": list(config.hydra.overrides.task),
                                        "sweeper": OmegaConf.to_container(config.hydra.sweeper, resolve=False),
                                        "launcher": config.hydra.launcher.get("_target_", "")})
        name = task_cfg.tracking.run_name or f"sweep {' '.join(short_names(keys).values()) or sweep_dir.name}"
        try:
            run_id = start_parent_run(task_cfg, sweep_dir, definition, run_name=name)
        except ConfigError as err:  # e.g. tracking.uri unreachable: one line, before any job starts
            log.error("config error: %s", err)
            sys.exit(2)
        write_sweep_keys(sweep_dir, keys)
        log.info("sweep parent run %s", run_id)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        if _follower():
            return
        task_cfg = validate({k: v for k, v in config.items() if k != "hydra"})
        sweep_dir = Path(config.hydra.sweep.dir)
        run_id = parent_run_id_for(sweep_dir)
        verdict = None
        if run_id is not None:
            failed = False
            try:
                _log_sweep_cost(task_cfg, run_id, time.time() - getattr(self, "started", time.time()))
                from draftlab.tracking.analyze import analyze_parent

                result = analyze_parent(run_id, tracking_uri=task_cfg.tracking.uri, out=sweep_dir / "analysis")
                verdict = f"{result.answer or result.headline} (tag verdict={result.tag})"  # as the parent holds it
            except Exception as err:  # the sweep's jobs are done and logged; a failed analysis must not hide them
                log.error("sweep analysis failed: %s", err)
                failed = True
            end_parent_run(task_cfg, run_id, failed=failed)
        uri = tracking_uri(task_cfg.tracking.uri) if task_cfg.tracking.enabled else None
        log.info("\n%s", sweep_summary(_job_results(sweep_dir), verdict, uri, run_id,
                                       _experiment_of(task_cfg) if run_id else None))


def _job_results(sweep_dir: Path) -> list[tuple[str, dict]]:
    """(run name, metrics) of each job, from the results.json its Hydra folder holds, in job order."""
    jobs = []
    for file in sorted(sweep_dir.glob("*/results.json"), key=lambda f: (len(f.parent.name), f.parent.name)):
        record = read_json(file) or {}
        name = record.get("params", {}).get("tracking.run_name") or f"job {file.parent.name}"
        jobs.append((name if name != "None" else f"job {file.parent.name}", record.get("metrics", {})))
    return jobs


def _experiment_of(cfg) -> str | None:
    try:
        return find_experiment_id(open_client(cfg.tracking.uri), cfg.tracking.experiment)
    except Exception:  # noqa: BLE001 - the link is a convenience
        return None


def _follower() -> bool:
    """A torchrun rank other than 0 runs the sweep's jobs too, but only rank 0 tracks (train/distributed.py)."""
    return int(os.environ.get("RANK", "0")) > 0


def _log_sweep_cost(cfg, parent_id: str, wall_seconds: float) -> None:
    """What sharing cached stages saved: the sweep's wall time against the sum of its jobs' own durations, and
    the samples generated against the samples the jobs asked for (generation runs once for the largest N)."""
    from draftlab.tracking.run_queries import child_runs
    from draftlab.tracking.runs import open_client

    client = open_client(cfg.tracking.uri)
    children = child_runs(client, parent_id)  # paged: a sweep may outgrow one page
    job_seconds = sum(((c.info.end_time or c.info.start_time) - c.info.start_time) / 1000 for c in children)
    stage_seconds = sum(v for c in children for k, v in c.data.metrics.items() if k.endswith("/seconds"))
    asked = sum(int(c.data.params.get("data.samples", 0)) for c in children)
    generated = sum(c.data.metrics.get("generate/new_samples", 0) for c in children
                    if c.data.metrics.get("generate/cached", 1) == 0)
    metrics = {"sweep/wall_seconds": wall_seconds, "sweep/jobs": len(children), "sweep/job_seconds_sum": job_seconds,
               "sweep/stage_seconds_sum": stage_seconds, "sweep/samples_asked_sum": asked,
               "sweep/samples_generated": generated}
    from draftlab.tracking.runs import log_metrics

    log_metrics(client, parent_id, metrics)
    log.info("sweep cost: %s", ", ".join(f"{k.split('/')[1]}={v:.0f}" for k, v in metrics.items()))
