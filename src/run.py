"""draftlab's command line: `python src/run.py data.samples=N`, `-m experiment=data_scaling`, `stages=[generate]`."""

import logging
import os
import sys
import tempfile

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from draftlab.config import ConfigError
from draftlab.task import run_task
from draftlab.tracking import parent_run_id_for

log = logging.getLogger("draftlab")


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    hydra_cfg = HydraConfig.get()
    sweep_dir = hydra_cfg.sweep.dir if hydra_cfg.mode == RunMode.MULTIRUN else None
    try:
        metrics = run_task(cfg, parent_run_id=parent_run_id_for(sweep_dir), output_dir=hydra_cfg.runtime.output_dir)
    except ConfigError as err:
        log.error("config error: %s", err)
        sys.exit(2)
    return metrics.get("val/loss")  # what a Hydra sweeper minimises


if __name__ == "__main__":
    if int(os.environ.get("RANK", "0")) > 0:
        # torchrun: rank 0 alone writes the Hydra run folder; the others log to stdout and leave no files
        sys.argv += ["hydra.output_subdir=null", "hydra/job_logging=stdout",
                     f"hydra.run.dir={tempfile.gettempdir()}/draftlab-rank{os.environ['RANK']}"]
    main()
