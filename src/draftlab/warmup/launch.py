"""The compile warm-up's processes (train.compile_warmup): started by the pipeline with generate, awaited before train.

What they do and why: warmup/compile.py (the unroll's training and validation graphs) and warmup/decode.py
(generate's compiled decode step). Here: when to start them, and how the job waits for them.
- The unroll's two start when the train stage will compile its unroll (train.compile_unroll, on CUDA by default) and
  have something to overlap with: a generate or extract stage that runs in this job (`auto`; `true` starts them even
  when those are cached). The train stage waits for them (logging every 30 s), at most WAIT_MAX_S, then stops them.
- The decode step's starts when this job's generate stage will answer with the compiled graphs step on a GPU
  (data.generator=graphs, data.compile_decode, greedy, in this process), with or without a train stage. Nobody waits
  for it: generate compiles the step itself if it gets there first, and it is stopped when generate ends.
Under torchrun none starts (the data-parallel trainer runs the eager unroll). Nothing depends on them: a failed or
stopped warm-up leaves its stage to compile what it lacks, as it would have, and says so with the tail of its log.

Run with argument lists (no shell), on the job's resolved config written to a temporary folder; their output goes to
log files there, not to the job's console, where it would interleave with generate's progress bars. Each holds a
CUDA context and a small model (the draft, or one layer of the target) on the GPU while generate runs (not measured
alone): with little memory to spare, a GPU shared with a serving engine (data.engine=server) or one in
exclusive-process mode, set train.compile_warmup=false, which turns off every one.
"""

from __future__ import annotations

import logging
import os
import shutil
import site
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

from omegaconf import OmegaConf

from draftlab.util.fsutil import read_json

log = logging.getLogger("draftlab")
WAIT_MAX_S = 900.0  # a cold build took 133 s on the H200; past this the warm-up is stopped
UPSTREAM = ("generate", "extract")


class WarmGraph(NamedTuple):
    stage: str  # the stage that loads it (and compiles it itself when the warm-up did not)
    what: str  # for the log
    argv: tuple[str, ...]  # python -m draftlab ARGV[0] CONFIG RESULT ARGV[1:]
    seconds: str  # the result's key for the compile's seconds


GRAPHS = {"training": WarmGraph("train", "the unroll's training graph", ("warm-compile",), "train/compile_s"),
          "validation": WarmGraph("train", "the unroll's validation graph", ("warm-compile", "--validation"),
                                  "train/compile_s"),
          "decode": WarmGraph("generate", "generate's decode step", ("warm-decode",), "decode_compile_s")}
UNROLL = ("training", "validation")


def wanted(cfg, planned: dict, names: list[str]) -> list[str]:
    """The graphs this job's warm-up builds (none: no warm-up): `names` are the stages it runs, `planned` their
    PlannedStage. train.compile_warmup=false turns off every one."""
    choice = str(cfg.train.compile_warmup).lower()
    if choice == "false" or int(os.environ.get("WORLD_SIZE", "1")) > 1:  # set by torchrun, or by task.py
        return []
    return (list(UNROLL) if _unroll_wanted(cfg, planned, names, choice) else []) + \
        (["decode"] if _decode_wanted(cfg, planned, names) else [])


def _unroll_wanted(cfg, planned: dict, names: list[str], choice: str) -> bool:
    if "train" not in names or planned["train"].done_record.exists():
        return False
    from draftlab.target.target import resolve_device
    from draftlab.train.compile_choice import compile_wanted

    if not compile_wanted("train.compile_unroll", cfg.train.compile_unroll, resolve_device(cfg.train.device)):
        return False
    return choice == "true" or any(n in names and not planned[n].done_record.exists() for n in UPSTREAM)


def _decode_wanted(cfg, planned: dict, names: list[str]) -> bool:
    """generate will answer here with the compiled graphs step (data.compile_decode) on a GPU (on a CPU the compile
    would take the cores generate needs)."""
    data = cfg.data
    if "generate" not in names or planned["generate"].done_record.exists():
        return False
    if not (data.generator == "graphs" and data.compile_decode and float(data.temperature) == 0
            and data.engine != "server"):
        return False
    from draftlab.target.target import resolve_device

    return resolve_device(cfg.target.device).type == "cuda"


def target_config(target_cfg, cache_dir: Path) -> dict:
    """The configured target's config as `Target.config_dict()` gives it, without loading its weights (generate holds
    the target meanwhile): the tiny target is built (it is small), the others' configs are read. For the warm-up's
    processes, which build models of the target's shape."""
    from transformers import AutoConfig

    from draftlab.target.target import SMOLLM2_GGUF, _smollm2_folder, embedded_gguf_folder, tiny_target

    if target_cfg.name == "tiny":
        return tiny_target(target_cfg.tiny).config_dict()
    if target_cfg.name == "smollm2":
        converted = _smollm2_folder(cache_dir)
        if (converted / "config.json").exists():
            return AutoConfig.from_pretrained(converted).to_dict()
        gguf = embedded_gguf_folder() / SMOLLM2_GGUF  # its metadata only: generate may be converting it
        return AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name).to_dict()
    kwargs = {"gguf_file": target_cfg.gguf_file} if target_cfg.gguf_file else {}
    return AutoConfig.from_pretrained(target_cfg.path, **kwargs).to_dict()


def exit_with_parent() -> None:
    """In a warm-up process: exits when the job that started it is gone (it was killed, so its `finally` never ran)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(5)
        os._exit(3)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def _child_env() -> dict[str, str]:
    """This environment, with the folder this draftlab is imported from on PYTHONPATH unless the interpreter finds it
    anyway (an installed package: a site-packages folder there would come before the standard library)."""
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])  # this file is <package_root>/draftlab/warmup/launch.py
    installed = {str(Path(p).resolve()) for p in (*site.getsitepackages(), site.getusersitepackages())}
    if package_root not in installed:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    return env


class Warmup:
    """One job's warm-up processes, one per graph (training's and validation's unroll, generate's decode step):
    `start` them, then `finish` (before train) or `stop` (the job ends without train)."""

    def __init__(self, folder: Path, processes: dict[str, subprocess.Popen]) -> None:
        self.folder, self.processes, self.started = folder, processes, time.monotonic()

    @classmethod
    def start(cls, cfg, graphs: list[str] | tuple[str, ...] = UNROLL) -> "Warmup | None":
        """The started warm-up of `graphs`; None, with a warning, when it cannot start (each stage then compiles)."""
        warmup = None
        try:
            warmup = cls(Path(tempfile.mkdtemp(prefix="draftlab-warmup-")), {})
            OmegaConf.save(cfg, warmup.folder / "config.yaml", resolve=True)
            env = _child_env()
            for graph in graphs:
                command, *flags = GRAPHS[graph].argv
                with open(warmup.folder / f"{graph}.log", "wb") as out:
                    warmup.processes[graph] = subprocess.Popen(
                        [sys.executable, "-m", "draftlab", command, str(warmup.folder / "config.yaml"),
                         str(warmup.folder / f"{graph}.json"), *flags],
                        stdout=out, stderr=subprocess.STDOUT, env=env)
        except OSError as error:
            log.warning("compile warm-up: could not start (%s); the stages compile their graphs", error)
            if warmup is not None:
                warmup.stop()
            return None
        log.info("compile warm-up: building %s in background processes while the job's first stages run (pids %s; "
                 "train.compile_warmup=false turns this off)", ", ".join(GRAPHS[g].what for g in graphs),
                 ", ".join(str(p.pid) for p in warmup.processes.values()))
        return warmup

    def finish(self) -> dict[str, float]:
        """Waits for the unroll's warm-up; returns train/compile_warmup_ok (1 when both graphs are in the cache) and
        train/compile_warmup_s (the longer process's whole run: start, trace, compile); {} when it built none. The
        decode step's warm-up is done with before (`generate_done`)."""
        self.generate_done()
        if not self.processes:
            self._clean()
            return {}
        waited = time.monotonic()
        while running := [p for p in self.processes.values() if p.poll() is None]:
            elapsed = time.monotonic() - self.started
            if elapsed > WAIT_MAX_S:
                log.warning("train: the compile warm-up ran %.0f s, past %.0f s: stopped; the train stage compiles "
                            "what it had not built", elapsed, WAIT_MAX_S)
                self._kill()
                break
            log.info("train: waiting for the compile warm-up (running for %.0f s)", elapsed)
            try:
                running[0].wait(timeout=min(30.0, WAIT_MAX_S - elapsed + 1))
            except subprocess.TimeoutExpired:
                pass
        results = {graph: self._result(graph, process) for graph, process in self.processes.items()}
        log.info("train: waited %.1f s for the compile warm-up", time.monotonic() - waited)
        self._clean()
        done = [r for r in results.values() if r is not None]
        metrics = {"train/compile_warmup_ok": float(len(done) == len(results))}
        if done:
            metrics["train/compile_warmup_s"] = max(float(r["warmup_s"]) for r in done)
        return metrics

    def generate_done(self) -> None:
        """The decode step's warm-up is of no use once generate is over: stopped if it still runs, its result logged.
        Never raises: the warm-up is optional, and generate has succeeded."""
        process = self.processes.pop("decode", None)
        if process is None:
            return
        if process.poll() is None:
            process.kill()
            process.wait()
            log.info("generate: the decode step's compile warm-up was still running when generate ended: stopped")
            return
        try:
            self._result("decode", process)
        except Exception as error:  # e.g. its folder removed from under it
            log.warning("generate: the decode step's compile warm-up could not be read (%s: %s)",
                        type(error).__name__, error)

    def _result(self, graph: str, process: subprocess.Popen) -> dict | None:
        """The finished process's metrics, logged; None, with its log's tail, when it failed."""
        result, spec = read_json(self.folder / f"{graph}.json"), GRAPHS[graph]
        if process.returncode == 0 and result is not None:
            log.info("%s: the compile warm-up built %s in %.1f s (%.1f s in all)", spec.stage, spec.what,
                     result[spec.seconds], result["warmup_s"])
            return result
        try:
            tail = (self.folder / f"{graph}.log").read_text(errors="replace").strip().splitlines()[-6:]
        except OSError as error:
            tail = [f"(its log could not be read: {error})"]
        log.warning("%s: the compile warm-up of the %s graph failed (exit %s), so the %s stage compiles it itself; its "
                    "log ends:\n  %s", spec.stage, graph, process.returncode, spec.stage, "\n  ".join(tail))
        return None

    def stop(self) -> None:
        """Ends the processes still running (the job failed or stopped before train) and removes their folder."""
        self._kill()
        self._clean()

    def _kill(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()

    def _clean(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
