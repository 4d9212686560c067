"""The task function behind `src/run.py`: validate, open the tracked run, run the stages.

Kept apart from `@hydra.main` (as lightning-hydra-template does) so that tests and other drivers call it with a
composed config.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from draftlab.config.config import validate
from draftlab.util.fsutil import atomic_write_json
from draftlab.pipeline import run_stages
from draftlab.plan.plan import log_plan
from draftlab.checks.preflight import preflight
from draftlab.provenance.provenance import git_state
from draftlab.util.reporting import RecordingReporter
from draftlab.tracking.summary import collect_warnings, job_summary
from draftlab.tracking.run_context import flatten, repo_root, tracking_uri
from draftlab.tracking.runs import tracked_run

log = logging.getLogger("draftlab")


def run_task(cfg, parent_run_id: str | None = None, output_dir: Path | None = None) -> dict[str, float]:
    """Runs the configured stages; returns every stage's metrics. With `output_dir` (the Hydra job folder) the
    job also leaves `results.json` there: params, tags and metrics, importable later with
    `python -m draftlab import-runs` when the job ran where no tracking store was reachable.
    The job ends with a summary table on the console (draftlab.tracking.summary)."""
    if "WORLD_SIZE" in os.environ or "SUBMITIT_EXECUTOR" in os.environ:  # torch only when it may be distributed
        from draftlab.train import distributed

        if distributed.world_size() > 1:  # under torchrun: rank 0 runs the job, the others join its training
            return distributed.run_task(cfg, _run_task, _follow_train, parent_run_id=parent_run_id,
                                        output_dir=output_dir)
    return _run_task(cfg, parent_run_id, output_dir)


def _val_samples(tags: dict[str, str]) -> dict:
    """The train stage's per-sample validation results, carried in results.json so that import-runs brings them
    along with the job (the sweep analysis bootstraps over them); {} when the job trained nothing."""
    file = Path(tags.get("folder.train", "")) / "val_samples.json"  # train/per_sample.FILE
    if not tags.get("folder.train") or not file.is_file():
        return {}
    return {"val_samples": json.loads(file.read_text())}


def _history(reporter) -> dict:
    """An untracked job's metrics logged at a step (validation passes, train logs, train/bench_tau) as
    {key: [[step, value], ...]}: import-runs logs them step by step, so its curves reach MLflow as a tracked job's do.
    {} for a tracked job: MLflow holds them already."""
    points: dict[str, list] = {}
    logged = reporter.history if isinstance(reporter, RecordingReporter) else []
    for step, values in ((s, v) for s, v in logged if s is not None):
        for key, value in values.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            pairs = points.setdefault(key, [])
            if pairs[-1:] != [[step, value]]:  # the stage's closing log repeats its last pass at the same step
                pairs.append([int(step), float(value)])
    return {"history": points} if points else {}


def _follow_train(cfg, out: Path, inputs: dict[str, Path]) -> None:
    """A torchrun rank other than 0: its share of the train stage rank 0 runs (train/distributed.py)."""
    from draftlab.util.reporting import NullReporter
    from draftlab.stages import train

    train.run(cfg, out, inputs, NullReporter())


def _run_task(cfg, parent_run_id: str | None = None, output_dir: Path | None = None) -> dict[str, float]:
    conf = validate(cfg)
    preflight(conf)
    log_plan(conf)  # what the run takes (draftlab/plan/plan.py); refuses a feature pool that cannot fit
    with collect_warnings() as warnings:
        if not conf.tracking.enabled:
            reporter = RecordingReporter()
            results = run_stages(conf, reporter)
        else:
            with tracked_run(conf, parent_run_id=parent_run_id) as reporter:
                results = run_stages(conf, reporter)
    results_file = None
    if output_dir is not None:
        tags = {**git_state(repo_root()), **getattr(reporter, "tags", {})}
        results_file = Path(output_dir) / "results.json"
        atomic_write_json(results_file, {"params": flatten(conf), "metrics": {k: v for k, v in results.items()
                                                                              if isinstance(v, (int, float))},
                                         "tags": tags, **_val_samples(tags), **_history(reporter)})
    uri = tracking_uri(conf.tracking.uri) if conf.tracking.enabled else None
    log.info("\n%s", job_summary(results, getattr(reporter, "tags", {}), warnings.messages, uri,
                                 run_id=getattr(reporter, "run_id", None),
                                 experiment_id=getattr(reporter, "experiment_id", None), results_file=results_file,
                                 stages=conf.stages))
    return results
