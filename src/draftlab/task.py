"""The task function behind `src/run.py`: validate, open the tracked run, run the stages.

Kept apart from `@hydra.main` (as lightning-hydra-template does) so that tests and other drivers call it with a
composed config.
"""

from __future__ import annotations

import logging
from pathlib import Path

from draftlab.config import ConfigError, validate
from draftlab.fsutil import atomic_write_json
from draftlab.pipeline import run_stages
from draftlab.provenance import git_state
from draftlab.reporting import RecordingReporter
from draftlab.tracking import flatten, repo_root, tracked_run

log = logging.getLogger("draftlab")


def preflight(cfg) -> None:
    """Checks that need the target's shape but not its weights, so that bad input fails before any work."""
    from draftlab.data.layers import resolve_layers
    from draftlab.target import target_shape

    shape = target_shape(cfg.target)
    resolve_layers(cfg.extract.layers, shape["num_hidden_layers"])  # raises ConfigError naming extract.layers
    if cfg.draft.vocab_size > shape["vocab_size"]:
        raise ConfigError(f"draft.vocab_size: {cfg.draft.vocab_size} is larger than the target vocabulary "
                          f"({shape['vocab_size']})")


def run_task(cfg, parent_run_id: str | None = None, output_dir: Path | None = None) -> dict[str, float]:
    """Runs the configured stages; returns every stage's metrics. With `output_dir` (the Hydra job folder) the
    job also leaves `results.json` there: params, tags and metrics, importable later with
    `python -m draftlab import-runs` when the job ran where no tracking store was reachable."""
    from draftlab.train import distributed

    if distributed.world_size() > 1:  # under torchrun: rank 0 runs the job, the others join its training
        return distributed.run_task(cfg, _run_task, parent_run_id=parent_run_id, output_dir=output_dir)
    return _run_task(cfg, parent_run_id, output_dir)


def _run_task(cfg, parent_run_id: str | None = None, output_dir: Path | None = None) -> dict[str, float]:
    conf = validate(cfg)
    preflight(conf)
    if not conf.tracking.enabled:
        reporter = RecordingReporter()
        results = run_stages(conf, reporter)
    else:
        with tracked_run(conf, parent_run_id=parent_run_id) as reporter:
            results = run_stages(conf, reporter)
    if output_dir is not None:
        tags = {**git_state(repo_root()), **getattr(reporter, "tags", {})}
        atomic_write_json(Path(output_dir) / "results.json",
                          {"params": flatten(conf), "metrics": {k: v for k, v in results.items()
                                                                if isinstance(v, (int, float))}, "tags": tags})
    return results
