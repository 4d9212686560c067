"""The doomed job of tests/integration/test_crash_resume.py: one stage of the tiny pipeline in a process of its own,
which SIGKILLs itself at a chosen file replacement.

    python tests/crash_child.py ROOT STAGE KILL_AT AFTER

A process of its own, not a fork of pytest: a fork inherits whatever the test session holds at that moment (threads
of earlier tests, their pools, patched modules). CI once saw such a forked child exit with status 1 and no
traceback (2026-12-04; not reproduced here). A real job starts clean, and so does this one; what it prints comes
back to the test.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "src")]

from conftest import compose_config, tiny_overrides  # noqa: E402
from draftlab.config.config import validate  # noqa: E402
from draftlab.pipeline import run_stages  # noqa: E402
from draftlab.util.reporting import NullReporter  # noqa: E402


def config(root: Path):
    # checkpoint_every=1: train's kill can land after a checkpoint, so resuming from one is exercised
    return validate(compose_config(tiny_overrides(root, "tracking.enabled=false", "train.checkpoint_every=1")))


class ReplaceCounter:
    """Stands in for os.replace (the last step of every atomic write): counts the calls and, in a doomed job, SIGKILLs
    the process at the `kill_at`-th one, just before the rename or just `after` it."""

    def __init__(self, kill_at: int = 0, after: bool = False):
        self.real, self.count, self.kill_at, self.after = os.replace, 0, kill_at, after

    def __call__(self, src, dst):
        self.count += 1
        if self.count == self.kill_at and not self.after:
            os.kill(os.getpid(), signal.SIGKILL)
        result = self.real(src, dst)
        if self.count == self.kill_at and self.after:
            os.kill(os.getpid(), signal.SIGKILL)
        return result


def main(root: str, stage: str, kill_at: str, after: str) -> int:
    cfg = config(Path(root))
    os.replace = ReplaceCounter(int(kill_at), after == "after")
    run_stages(cfg, NullReporter(), names=[stage])
    return 3  # finished: the kill point was never reached


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
