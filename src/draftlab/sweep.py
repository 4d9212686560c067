"""A Hydra callback that gives each multirun one MLflow parent run, whatever launcher runs the jobs.

The parent's id is left in the sweep folder (`tracking.PARENT_ID_FILE`); each job reads it and tags its own run
as a child. At the end the parent gets the analysis of its children (src/analyze.py).
"""

from __future__ import annotations

import logging
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from draftlab.config import validate
from draftlab.tracking import end_parent_run, parent_run_id_for, start_parent_run

log = logging.getLogger("draftlab.sweep")


class SweepCallback(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        task_cfg = validate({k: v for k, v in config.items() if k != "hydra"})
        if not task_cfg.tracking.enabled:
            return
        definition = OmegaConf.to_yaml({"overrides": list(config.hydra.overrides.task),
                                        "sweeper": OmegaConf.to_container(config.hydra.sweeper, resolve=False),
                                        "launcher": config.hydra.launcher.get("_target_", "")})
        run_id = start_parent_run(task_cfg, Path(config.hydra.sweep.dir), definition)
        log.info("sweep parent run %s", run_id)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        task_cfg = validate({k: v for k, v in config.items() if k != "hydra"})
        run_id = parent_run_id_for(Path(config.hydra.sweep.dir))
        if run_id is None:
            return
        failed = False
        try:
            from draftlab.analysis.cli import analyze_parent

            analyze_parent(run_id, tracking_uri=task_cfg.tracking.uri, out=Path(config.hydra.sweep.dir) / "analysis")
        except Exception as err:  # the sweep's jobs are done and logged; a failed analysis must not hide them
            log.error("sweep analysis failed: %s", err)
            failed = True
        end_parent_run(task_cfg, run_id, failed=failed)
