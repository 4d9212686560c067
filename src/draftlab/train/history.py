"""A resumed training job logs the curve its killed predecessor had logged, so its MLflow run holds all of it.

The killed job's points went to a run that is now KILLED (draftlab.tracking.runs.close_orphans); the analysis reads
the finished run's curves, which without this held only the epochs after the resume (val/loss 2 of 4 points).
The checkpoint's `history` (one entry per finished epoch, as the loop logged it) is the record.
"""

from __future__ import annotations

import logging
from pathlib import Path

from draftlab.util.fsutil import read_json
from draftlab.util.reporting import Reporter
from draftlab.train.checkpoint import latest_checkpoint

log = logging.getLogger("draftlab")


def checkpoint_history(ckpt_dir: Path) -> list[dict]:
    """The entries the latest checkpoint holds that the loop logged: validation passes, then the benches of
    train.bench_every (train/bench_tau)."""
    latest = latest_checkpoint(ckpt_dir)
    if latest is None:
        return []
    state = read_json(latest / "trainer.json") or {}
    passes = [entry for entry in state.get("history", []) if any(k.startswith("val/") for k in entry)]
    return passes + [{"step": b["step"], "train/bench_tau": b["train/bench_tau"]} for b in state.get("bench") or []]


def replay_history(ckpt_dir: Path, reporter: Reporter) -> int:
    """Logs each checkpointed epoch entry at its step, as the loop did; returns how many."""
    entries = checkpoint_history(ckpt_dir)
    for entry in entries:
        reporter.metrics(entry, step=int(entry["step"]))
    if entries:
        log.info("train: resuming; logged the %d epoch(s) of validation history from the checkpoint", len(entries))
    return len(entries)
