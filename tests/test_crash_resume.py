"""kill -9 at a random point of each stage, then a rerun: the outputs equal an uninterrupted run's (issue 14
part 7).

The kill is real (SIGKILL from the kernel, no cleanup runs). It lands at a seeded random file replacement of the
stage, just before or just after the rename, the moments where a half-written output could survive; the seed
is DRAFTLAB_CRASH_SEED (default 0) and every kill point is logged, so a failure can be replayed. The killed job
is a fork of the test process, so it costs no start-up: a few seconds per stage on the tiny target.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
from pathlib import Path

from conftest import compose_config, tiny_overrides
from draftlab.config import validate
from draftlab.pipeline import plan, run_stages
from draftlab.reporting import NullReporter

log = logging.getLogger("draftlab.tests.crash")
STAGES = ["generate", "extract", "train", "bench"]
SEED = int(os.environ.get("DRAFTLAB_CRASH_SEED", "0"))
# Timings differ between runs by nature, and how much work a run found already done is its history, not its
# output (a rerun after a kill finds some); everything else must be equal.
TIMING = ("seconds", "per_s", "wait", "speedup", "wall", "time", "new_samples", "new_steps", "cached")
# Not outputs: which commit produced a stage (a commit made while the test runs must not fail it).
PROVENANCE = ("produced_by",)
SKIP = (".lock", ".png")  # locks; plots embed nothing but what the JSON next to them holds


def config(root: Path):
    # checkpoint_every=1: train's kill can land after a checkpoint, so resuming from one is exercised
    return validate(compose_config(tiny_overrides(root, "tracking.enabled=false", "train.checkpoint_every=1")))


class ReplaceCounter:
    """Counts os.replace calls (the last step of every atomic write) and, in a doomed child, SIGKILLs itself at
    the chosen one."""

    def __init__(self, monkeypatch, kill_at: int = 0, after: bool = False):
        self.real, self.count, self.kill_at, self.after = os.replace, 0, kill_at, after
        monkeypatch.setattr(os, "replace", self)

    def __call__(self, src, dst):
        self.count += 1
        if self.count == self.kill_at and not self.after:
            os.kill(os.getpid(), signal.SIGKILL)
        result = self.real(src, dst)
        if self.count == self.kill_at and self.after:
            os.kill(os.getpid(), signal.SIGKILL)
        return result


def killed_run(cfg, stage: str, counter: ReplaceCounter) -> None:
    """Runs the stage in a forked child that kills itself at counter.kill_at; returns once it died."""
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            run_stages(cfg, NullReporter(), names=[stage])
            code = 3  # finished: the kill point was never reached
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"child exit status {status}"


def normalised(path: Path, root: Path):
    """JSON without timings, with the run's own root written as <root>; any other file as bytes."""
    if path.suffix in (".json", ".jsonl"):
        text = path.read_text().replace(str(root), "<root>")
        if path.suffix == ".json":
            return _drop_timing(json.loads(text))
        return [_drop_timing(json.loads(line)) for line in text.splitlines() if line.strip()]
    return path.read_bytes()


def _drop_timing(obj):
    if isinstance(obj, dict):
        return {k: _drop_timing(v) for k, v in obj.items() if not (k.endswith("_s") or any(t in k for t in TIMING + PROVENANCE))}
    if isinstance(obj, list):
        return [_drop_timing(v) for v in obj]
    return obj


def outputs(folder: Path, root: Path) -> dict[str, object]:
    """Every output file of a stage folder; checkpoints are resume state, not outputs, and differ in number."""
    return {str(p.relative_to(folder)): normalised(p, root) for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.endswith(SKIP) and "checkpoints" not in p.parts}


def test_kill_9_anywhere_then_rerun_equals_uninterrupted(tmp_path, monkeypatch):
    rng = random.Random(SEED)
    reference, crashed = config(tmp_path / "reference"), config(tmp_path / "crashed")
    for stage in STAGES:
        with monkeypatch.context() as patch:
            counter = ReplaceCounter(patch)
            run_stages(reference, NullReporter(), names=[stage])
        kill_at, after = rng.randint(1, counter.count), rng.random() < 0.5
        log.warning("crash test (DRAFTLAB_CRASH_SEED=%d): kill -9 %s at file replacement %d of %d, %s the rename",
                    SEED, stage, kill_at, counter.count, "after" if after else "before")
        with monkeypatch.context() as patch:
            killed_run(crashed, stage, ReplaceCounter(patch, kill_at, after))
        run_stages(crashed, NullReporter(), names=[stage])  # the rerun resumes what the kill left

        want = outputs(plan(reference)[stage].folder, tmp_path / "reference")
        got = outputs(plan(crashed)[stage].folder, tmp_path / "crashed")
        assert sorted(got) == sorted(want), (stage, kill_at)
        for name in want:
            assert got[name] == want[name], f"{stage}/{name} differs after a kill at replacement {kill_at}"
        leftovers = [p for p in plan(crashed)[stage].folder.rglob("*.tmp")]
        assert not leftovers, leftovers
