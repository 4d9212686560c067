"""A Hydra callback that gives each multirun one MLflow parent run, whatever launcher runs the jobs.

The parent's id is left in the sweep folder (`tracking.PARENT_ID_FILE`); each job reads it and tags its own run
as a child. At the end the parent gets the analysis of its children (src/analyze.py).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from draftlab.config import validate
from draftlab.tracking import end_parent_run, parent_run_id_for, start_parent_run

log = logging.getLogger("draftlab.sweep")


class SweepCallback(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        if _follower():
            return
        task_cfg = validate({k: v for k, v in config.items() if k != "hydra"})
        if not task_cfg.tracking.enabled:
            return
        definition = OmegaConf.to_yaml({"overrides": list(config.hydra.overrides.task),
                                        "sweeper": OmegaConf.to_container(config.hydra.sweeper, resolve=False),
                                        "launcher": config.hydra.launcher.get("_target_", "")})
        run_id = start_parent_run(task_cfg, Path(config.hydra.sweep.dir), definition)
        self.started = time.time()
        log.info("sweep parent run %s", run_id)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        if _follower():
            return
        task_cfg = validate({k: v for k, v in config.items() if k != "hydra"})
        run_id = parent_run_id_for(Path(config.hydra.sweep.dir))
        if run_id is None:
            return
        failed = False
        try:
            _log_sweep_cost(task_cfg, run_id, time.time() - getattr(self, "started", time.time()))
            from draftlab.analysis.cli import analyze_parent

            analyze_parent(run_id, tracking_uri=task_cfg.tracking.uri, out=Path(config.hydra.sweep.dir) / "analysis")
        except Exception as err:  # the sweep's jobs are done and logged; a failed analysis must not hide them
            log.error("sweep analysis failed: %s", err)
            failed = True
        end_parent_run(task_cfg, run_id, failed=failed)


def _follower() -> bool:
    """A torchrun rank other than 0 runs the sweep's jobs too, but only rank 0 tracks (train/distributed.py)."""
    return int(os.environ.get("RANK", "0")) > 0


def _log_sweep_cost(cfg, parent_id: str, wall_seconds: float) -> None:
    """What sharing cached stages saved: the sweep's wall time against the sum of its jobs' own durations, and
    the samples generated against the samples the jobs asked for (generation runs once for the largest N)."""
    from draftlab.tracking import _client, tracking_uri

    client = _client(tracking_uri(cfg.tracking.uri))
    parent = client.get_run(parent_id)
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'",
                                  max_results=10_000)
    job_seconds = sum(((c.info.end_time or c.info.start_time) - c.info.start_time) / 1000 for c in children)
    stage_seconds = sum(v for c in children for k, v in c.data.metrics.items() if k.endswith("/seconds"))
    asked = sum(int(c.data.params.get("data.samples", 0)) for c in children)
    generated = sum(c.data.metrics.get("generate/new_samples", 0) for c in children
                    if c.data.metrics.get("generate/cached", 1) == 0)
    metrics = {"sweep/wall_seconds": wall_seconds, "sweep/jobs": len(children), "sweep/job_seconds_sum": job_seconds,
               "sweep/stage_seconds_sum": stage_seconds, "sweep/samples_asked_sum": asked,
               "sweep/samples_generated": generated}
    from draftlab.tracking import MlflowReporter

    MlflowReporter(client, parent_id).metrics(metrics)
    log.info("sweep cost: %s", ", ".join(f"{k.split('/')[1]}={v:.0f}" for k, v in metrics.items()))
