"""draftlab's command line: `python src/run.py data.samples=N`, `-m experiment=data_scaling`, `stages=[generate]`."""

import logging
import os
import sys
import tempfile

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from draftlab.config.config import ConfigError, check_overrides
from draftlab.tracking.run_names import job_run_name
from draftlab.task import run_task
from draftlab.tracking.run_context import parent_run_id_for

log = logging.getLogger("draftlab")
# (module, class) of the errors besides ConfigError that refuse input: see _refusals
REFUSALS = [("draftlab.serve.remote", "ServerError"), ("draftlab.sglang.monitor", "ServerStartError"),
            ("draftlab.sglang.client", "SGLangClientError"), ("draftlab.sglang.launch", "LaunchError"),
            ("draftlab.sglang.bench", "DraftCheckError"), ("draftlab.serve.loader", "DraftLoadError"),
            ("draftlab.sglang.st_files", "DraftFilesError"), ("draftlab.serve.alarm", "DraftAlarm")]
# conf/config.yaml's hydra.run.dir / sweep.dir end in the pid, so two jobs started at once never share a folder
# (run.log interleaved, results.json overwritten). Cached: a sweep's jobs see their launcher's value.
OmegaConf.register_new_resolver("draftlab.pid", os.getpid, use_cache=True, replace=True)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    hydra_cfg = HydraConfig.get()
    sweep_dir = hydra_cfg.sweep.dir if hydra_cfg.mode == RunMode.MULTIRUN else None
    if cfg.tracking.run_name is None:  # name the MLflow run after what this job varies
        cfg.tracking.run_name = job_run_name(hydra_cfg, sweep_dir)
    try:
        metrics = run_task(cfg, parent_run_id=parent_run_id_for(sweep_dir), output_dir=hydra_cfg.runtime.output_dir)
    except _refusals() as err:
        _traceback_to_log_files(err)
        # one line on the console, naming the key, file or line; the rest of a longer message is in run.log
        lines = str(err).strip().splitlines() or [type(err).__name__]
        more = " (more in the job's run.log)" if len(lines) > 1 else ""
        log.error("%s: %s%s", "config error" if isinstance(err, ConfigError) else "error", lines[0], more)
        sys.exit(2)
    return metrics.get("val/loss")  # what a Hydra sweeper minimises


def _refusals() -> tuple[type[BaseException], ...]:
    """Errors that refuse the job's input or surroundings (a setting, a server, a draft folder), as opposed to a
    fault in draftlab: they end the job the way config errors do. A module not yet imported cannot have raised
    its error, so none is imported here (some pull in torch)."""
    loaded = [getattr(sys.modules[module], name) for module, name in REFUSALS if module in sys.modules]
    return (ConfigError, *loaded)


def _traceback_to_log_files(err: Exception) -> None:
    """The full traceback goes to the job's log file (Hydra's run.log) only, not to the console."""
    record = log.makeRecord(log.name, logging.DEBUG, __file__, 0, "traceback of the error below", None,
                            (type(err), err, err.__traceback__))
    for handler in logging.getLogger().handlers + log.handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


if __name__ == "__main__":
    if int(os.environ.get("RANK", "0")) > 0:
        # torchrun: rank 0 alone writes the Hydra run folder; the others log to stdout and leave no files
        sys.argv += ["hydra.output_subdir=null", "hydra/job_logging=stdout",
                     f"hydra.run.dir={tempfile.gettempdir()}/draftlab-rank{os.environ['RANK']}"]
    try:  # Hydra answers a misspelt override in several lines and exit 1; the contract is one line and exit 2
        check_overrides(sys.argv[1:])
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        sys.exit(2)
    main()
