"""The compile warm-up's process (train.compile_warmup): started by the pipeline before generate, awaited before train.

What it does and why: train/compile_warmup.py. Here: when to start it, and how the job waits for it. It starts when
the train stage will compile its unroll (train.compile_unroll, on CUDA by default) and has something to overlap
with: a generate or extract stage that runs in this job (`auto`; `true` starts it even when they are cached). Under
torchrun it does not start (the data-parallel trainer runs the eager unroll). The train stage waits for it (logging
every 30 s), at most WAIT_MAX_S, then stops it. Nothing depends on it: a failed or stopped warm-up leaves the train
stage to compile as it would have, and says so with the tail of its log.

Run with an argument list (no shell), on the job's resolved config written to a temporary folder; its output goes to
a log file there, not to the job's console, where it would interleave with generate's progress bars.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from omegaconf import OmegaConf

import draftlab
from draftlab.fsutil import read_json

log = logging.getLogger("draftlab")
WAIT_MAX_S = 900.0  # a cold compile took 157.5 s on the H200 (BENCHMARKS.md); past this the warm-up is stopped
UPSTREAM = ("generate", "extract")


def wanted(cfg, planned: dict, names: list[str]) -> bool:
    """Whether this job starts a warm-up: `names` are the stages it runs, `planned` their PlannedStage."""
    choice = str(cfg.train.compile_warmup).lower()
    if choice == "false" or "train" not in names or planned["train"].done_record.exists():
        return False
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return False
    from draftlab.target import resolve_device
    from draftlab.train.ttt import compile_wanted

    if not compile_wanted("train.compile_unroll", cfg.train.compile_unroll, resolve_device(cfg.train.device)):
        return False
    return choice == "true" or any(n in names and not planned[n].done_record.exists() for n in UPSTREAM)


class Warmup:
    """One job's warm-up process: `start` it, then `finish` (before train) or `stop` (the job ends without it)."""

    def __init__(self, folder: Path, process: subprocess.Popen) -> None:
        self.folder, self.process, self.started = folder, process, time.monotonic()

    @classmethod
    def start(cls, cfg) -> "Warmup":
        folder = Path(tempfile.mkdtemp(prefix="draftlab-warmup-"))
        OmegaConf.save(cfg, folder / "config.yaml", resolve=True)
        env = dict(os.environ)  # the child imports this same draftlab, installed or not
        package_root = str(Path(draftlab.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        with open(folder / "warmup.log", "wb") as out:
            process = subprocess.Popen([sys.executable, "-m", "draftlab", "warm-compile", str(folder / "config.yaml"),
                                        str(folder / "result.json")], stdout=out, stderr=subprocess.STDOUT, env=env)
        log.info("train: compiling the unroll in the background while the stages before train run (pid %d; "
                 "train.compile_warmup=false turns this off)", process.pid)
        return cls(folder, process)

    def finish(self) -> dict[str, float]:
        """Waits for the warm-up; returns train/compile_warmup_ok (1 when its graph is in the cache) and
        train/compile_warmup_s (its whole run: start, trace, compile)."""
        waited = time.monotonic()
        while self.process.poll() is None:
            elapsed = time.monotonic() - self.started
            if elapsed > WAIT_MAX_S:
                log.warning("train: the compile warm-up ran %.0f s, past %.0f s: stopped; the train stage compiles "
                            "the unroll itself", elapsed, WAIT_MAX_S)
                self.process.kill()
                self.process.wait()
                break
            log.info("train: waiting for the compile warm-up (running for %.0f s)", elapsed)
            try:
                self.process.wait(timeout=min(30.0, WAIT_MAX_S - elapsed + 1))
            except subprocess.TimeoutExpired:
                pass
        result = read_json(self.folder / "result.json")
        if self.process.returncode != 0 or result is None:
            tail = (self.folder / "warmup.log").read_text(errors="replace").strip().splitlines()[-6:]
            log.warning("train: the compile warm-up failed (exit %s), so the train stage compiles the unroll itself; "
                        "its log ends:\n  %s", self.process.returncode, "\n  ".join(tail))
            metrics = {"train/compile_warmup_ok": 0.0}
        else:
            log.info("train: the compile warm-up built the unroll in %.1f s (%.1f s in all; waited %.1f s for it)",
                     result["train/compile_s"], result["warmup_s"], time.monotonic() - waited)
            metrics = {"train/compile_warmup_ok": 1.0, "train/compile_warmup_s": float(result["warmup_s"])}
        self._clean()
        return metrics

    def stop(self) -> None:
        """Ends the process if it still runs (the job failed or stopped before train) and removes its folder."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._clean()

    def _clean(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
