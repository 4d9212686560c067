"""A Hydra callback that checks paths.root before Hydra makes the job's folder under it.

Hydra creates `paths.root/runs/...` (or `multirun/...`) and its run.log before the task starts, so an unusable
paths.root would otherwise end in a pathlib traceback. Listed first in conf/config.yaml's hydra.callbacks.
"""

from __future__ import annotations

import logging
import sys

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from draftlab.config.config import ConfigError
from draftlab.checks.preflight import check_paths_root

log = logging.getLogger("draftlab")


class PathsRootCheck(Callback):
    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        _check(config)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        _check(config)


def _check(config: DictConfig) -> None:
    try:
        check_paths_root(config.paths.root)
    except ConfigError as err:  # no job folder, so no log file: the one line is all there is
        log.error("config error: %s", err)
        sys.exit(2)
