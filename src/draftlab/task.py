"""The task function behind `src/run.py`: validate, open the tracked run, run the stages.

Kept apart from `@hydra.main` (as lightning-hydra-template does) so that tests and other drivers call it with a
composed config.
"""

from __future__ import annotations

import logging

from draftlab.config import ConfigError, validate
from draftlab.pipeline import run_stages
from draftlab.reporting import NullReporter
from draftlab.tracking import tracked_run

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


def run_task(cfg, parent_run_id: str | None = None) -> dict[str, float]:
    """Runs the configured stages; returns every stage's metrics."""
    conf = validate(cfg)
    preflight(conf)
    if not conf.tracking.enabled:
        return run_stages(conf, NullReporter())
    with tracked_run(conf, parent_run_id=parent_run_id) as reporter:
        return run_stages(conf, reporter)
