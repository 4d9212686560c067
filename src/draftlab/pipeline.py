"""Runs the stages of a `src/run.py` job in order, recomputing only what changed.

Each stage's folder is `paths.root/<stage>/<key>/` (keys: `draftlab.plan.stage_keys`), so parallel jobs of a sweep
never collide and equal work is done once. Incremental stages (generate, extract) leave `data.samples` out of
their folder key: the folder is a pool that grows, and a finished request is remembered by a completion record
keyed by the full key. The record also names the commit that produced it and the device it ran on, logged as
`<stage>/produced_by` and `<stage>/produced_on` when a later job reuses it, and keeps the stage's warnings, which
that job raises again for its summary.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from omegaconf import OmegaConf

from draftlab.util.fsutil import atomic_write_json, file_lock, read_json, remove_leftovers
from draftlab.provenance.provenance import git_state
from draftlab.util.reporting import Reporter
# re-exported: callers plan through the pipeline
from draftlab.plan.stage_keys import NOT_FINGERPRINTED, STAGES, PlannedStage, StageSpec, plan  # noqa: F401
from draftlab.stages import final_step, invoke  # noqa: F401 (final_step re-exported)
from draftlab.tracking.summary import STAGE_WARNINGS_EXCLUDE, collect_warnings, repeat_stage_warnings, stage_warnings
from draftlab.warmup.launch import Warmup, wanted as warmup_wanted

log = logging.getLogger("draftlab.pipeline")
PRODUCED_BY = "draftlab/produced_by"  # key of the producing commit inside a completion record


def run_stages(cfg, reporter: Reporter, names: list[str] | None = None) -> dict[str, float]:
    """Runs the requested stages in order, skipping those already done; returns every stage's metrics."""
    wanted = [n for n in STAGES if n in (names or cfg.stages)]
    planned = plan(cfg)
    commit = _current_commit()
    results: dict[str, float] = {}
    tags: dict[str, str] = {}
    # the train stage's compiled graphs, built while generate and extract run, and generate's compiled decode step,
    # built while it converts and tokenises (draftlab/warmup/launch.py)
    graphs = warmup_wanted(cfg, planned, wanted)
    warmup = Warmup.start(cfg, graphs) if graphs else None
    try:  # the stages that finished are tagged even when a later one fails
        for name in wanted:
            stage = planned[name]
            inputs = {up: planned[up].folder for up in stage.spec.needs}
            for up in stage.spec.needs:
                if up not in wanted and not planned[up].done_record.exists():
                    raise RuntimeError(f"stage {name} needs {up} output {planned[up].folder}, which is not "
                                       f"complete: run with stages=[{up},{name}] or all stages")
            if name == "train" and warmup is not None:
                warmed, warmup = warmup.finish(), None
                reporter.metrics(warmed)
                results.update(warmed)
            stage_cfg = _continuation(cfg) if name == "train" else cfg
            metrics, provenance = run_stage(stage_cfg, stage, inputs, reporter, commit)
            if name == "generate" and warmup is not None:
                warmup.generate_done()
            tags.update({f"fingerprint.{name}": stage.key, f"folder.{name}": str(stage.folder),
                         f"code.{name}": stage.code, **{f"{name}/{k}": v for k, v in provenance.items()}})
            results.update(metrics)
    finally:
        if warmup is not None:  # a stage before train failed, or the job has no train stage
            warmup.stop()
        _tag_all(reporter, tags)
    return results


def _current_commit() -> str:
    """The commit a stage run now is produced by; a dirty tree is not its commit, so it says so."""
    from draftlab.tracking.run_context import repo_root

    state = git_state(repo_root())
    return state["git.commit"] + ("+dirty" if state["git.dirty"] == "true" else "")


def _tag_all(reporter: Reporter, tags: dict[str, str]) -> None:
    """In one call where the reporter can (MLflow: one transaction, not one per tag)."""
    if not tags:
        return
    if hasattr(reporter, "tag_many"):
        reporter.tag_many(tags)
    else:
        for key, value in tags.items():
            reporter.tag(key, value)


def _with(cfg, key: str, value):
    copy = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    OmegaConf.update(copy, key, value)
    OmegaConf.set_readonly(copy, True)
    return copy


def _continuation(cfg):
    """`train.init_from: shorter` (the epochs sweep): continue from the longest finished run of the same
    config with fewer epochs. The folder key keeps the word "shorter", so the choice never splits a cache."""
    if cfg.train.init_from != "shorter":
        return cfg
    for epochs in range(cfg.train.epochs - 1, 0, -1):
        shorter = plan(_with(cfg, "train.epochs", epochs))["train"]
        if shorter.done_record.exists():
            log.info("train: continuing from the %d-epoch run in %s", epochs, shorter.folder)
            return _with(cfg, "train.init_from", str(shorter.folder))
    return _with(cfg, "train.init_from", None)


def run_stage(cfg, stage: PlannedStage, inputs: dict[str, Path], reporter: Reporter,
              commit: str = "unknown") -> tuple[dict[str, float], dict[str, str]]:
    """(metrics, {"produced_by": commit, "produced_on": device}): runs the stage through `invoke`, or reuses its
    completion record."""
    name = stage.spec.name
    record = read_json(stage.done_record)
    if record is None:
        stage.folder.mkdir(parents=True, exist_ok=True)
        with file_lock(stage.folder.with_suffix(".lock")):  # a parallel job doing the same work waits here
            record = read_json(stage.done_record)
            if record is None:
                remove_leftovers(stage.folder, ".*.tmp", recursive=True)  # a killed job's half-written files
                log.info("stage %s: running in %s", name, stage.folder)
                files = () if stage.spec.incremental else (stage.folder / "metrics.json",)
                with collect_warnings(exclude=STAGE_WARNINGS_EXCLUDE) as warned:
                    metrics = invoke(name, cfg, stage.folder, inputs, reporter, metrics_files=files)
                provenance = {"produced_by": commit, "produced_on": _device()}
                atomic_write_json(stage.done_record, {"metrics": metrics, **provenance,
                                                      "warnings": stage_warnings(warned)})
                return metrics, provenance
    log.info("stage %s: cached in %s (produced by commit %s), skipped", name, stage.folder, record["produced_by"])
    repeat_stage_warnings(log, name, record)
    metrics = {**record["metrics"], f"{name}/cached": 1.0, f"{name}/seconds": 0.0}
    reporter.metrics(metrics, step=final_step(metrics))
    return metrics, {"produced_by": record["produced_by"], "produced_on": record.get("produced_on", "unknown")}


def _device() -> str:
    """The device this process ran the stage on: the GPU's name and SM count; "no GPU work" where a GPU is there
    but the stage used none (a pool that already held the samples); else "cpu". Greedy answers generated again
    can differ between machines (docs/tracking.md), so each completion record names its device."""
    torch = sys.modules.get("torch")  # never imported just to ask: a stage that computed anything imported it
    if torch is not None and torch.cuda.is_initialized():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return f"{props.name} ({props.multi_processor_count} SMs)"
    return "no GPU work" if torch is not None and torch.cuda.is_available() else "cpu"
