"""`python -m draftlab stage <name>`: one stage as a DVC command, on the config DVC composed into params.yaml.

DVC decides what to rerun; this only loads params.yaml (no Hydra, as DVC's docs advise for stage code), runs
the stage through the same `draftlab.stages.invoke` as src/run.py, writes the metrics file `dvc exp show`
reads, and logs into one MLflow run per `dvc repro` / `dvc exp run`: the stages of one DVC command share a run,
and a later command (even with the same params) opens a new one, tagged with its own commit.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from omegaconf import OmegaConf

from draftlab.util.cli_parser import ArgumentParser
from draftlab.config.config import STAGE_NAMES, validate
from draftlab.provenance.provenance import file_sha256
from draftlab.stages import invoke

log = logging.getLogger("draftlab.dvc")
METRICS_DIR = Path("dvc_metrics")  # tracked by git (not under the ignored dvcout/) so `dvc exp show` sees it
INVOCATION_TAG = "draftlab.dvc_invocation"


def _proc_stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time in clock ticks) of a process, from /proc (Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # the command name may hold spaces: cut after it
    return int(fields[1]), fields[19]


def dvc_invocation(pid: int | None = None) -> str:
    """Names the DVC command this stage runs under: pid and start time of the nearest ancestor process
    whose command line is dvc's (every stage of one `dvc repro` is its child; a later command is another
    process). Without /proc, the parent process stands in for it."""
    pid = os.getppid() if pid is None else pid
    while pid > 1:
        stat = _proc_stat(pid)
        if stat is None:
            break
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            break
        if any(Path(arg.decode(errors="replace")).name in ("dvc", "dvc.exe") or arg == b"dvc.__main__"
               for arg in argv[:3]):
            return f"{pid}-{stat[1]}"
        pid = stat[0]
    return f"{os.getppid()}-{(_proc_stat(os.getppid()) or (0, '0'))[1]}"


def run_dvc_stage(name: str, params: Path, out: Path, inputs: dict[str, Path]) -> dict[str, float]:
    cfg = validate(OmegaConf.load(params))
    if cfg.train.init_from == "shorter":
        # DVC keeps one train folder, so there is no shorter run beside it: train from scratch.
        log.warning("train.init_from=shorter has no meaning under DVC; training from scratch")
        cfg = OmegaConf.merge(cfg, {"train": {"init_from": None}})
    if cfg.extract.pool_root:  # dvc.yaml names the stage's folder (dvcout/extract): nothing to make elsewhere
        log.info("extract.pool_root=%s is src/run.py's; under DVC the pool is dvcout/extract", cfg.extract.pool_root)
        cfg = OmegaConf.merge(cfg, {"extract": {"pool_root": None}})
    from draftlab.checks.preflight import preflight

    preflight(cfg)
    METRICS_DIR.mkdir(exist_ok=True)

    def work(reporter) -> dict[str, float]:
        metrics = invoke(name, cfg, out, inputs, reporter, metrics_files=(METRICS_DIR / f"{name}.json",))
        if name == "train":
            _write_curve(out / "manifest.json", METRICS_DIR / "train_curve.csv")
        return metrics

    if not cfg.tracking.enabled:
        from draftlab.util.reporting import NullReporter

        return work(NullReporter())
    from draftlab.tracking.runs import find_run, reopened_run, tracked_run

    tags = {INVOCATION_TAG: dvc_invocation(), "draftlab.dvc_key": file_sha256(params)[:16]}
    run_id = find_run(cfg, tags)
    if run_id is None:
        with tracked_run(cfg, tags={**tags, "draftlab.driver": "dvc"}) as reporter:
            return work(reporter)
    with reopened_run(cfg, run_id) as reporter:
        return work(reporter)


def _write_curve(manifest: Path, path: Path) -> None:
    """Per-epoch validation curves in the CSV form `dvc plots` reads."""
    import csv
    import io
    import json

    history = json.loads(manifest.read_text()).get("history", [])
    columns = sorted({key for entry in history for key in entry} - {"epoch", "step"})
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["epoch", "step", *[c.replace("/", "_") for c in columns]])
    for entry in history:
        writer.writerow([entry.get("epoch"), entry.get("step"), *[entry.get(c, "") for c in columns]])
    from draftlab.util.fsutil import atomic_write_text

    atomic_write_text(path, buffer.getvalue())


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="python -m draftlab stage", description=__doc__)
    parser.add_argument("name", choices=STAGE_NAMES)
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--in", dest="inputs", action="append", default=[], metavar="STAGE=DIR")
    args = parser.parse_args(argv)
    inputs = {}
    for item in args.inputs:
        stage, _, folder = item.partition("=")
        if not folder:
            parser.error(f"--in {item}: expected STAGE=DIR")
        inputs[stage] = Path(folder)
    run_dvc_stage(args.name, args.params, args.out, inputs)
    return 0
