"""Where a benchmark's result goes: results.json (machine, commit, command, numbers), the MLflow experiment
`benchmarks`, and a table on stdout."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
from datetime import datetime
from importlib import metadata
from pathlib import Path

from draftlab.benchmarks.declarations import Benchmark
from draftlab.benchmarks.measure import Measured
from draftlab.provenance.provenance import git_state

EXPERIMENT = "benchmarks"
MAX_TABLE_ROWS = 24  # the deciding metric first, then the others in name order; results.json has them all


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _gpus() -> list[str]:
    """The GPUs' names from nvidia-smi (no torch import: --list and CPU runs stay fast)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def machine_name(cpu: str, gpus: list[str]) -> str:
    """The machine as BENCHMARKS.md's table names it: the GPUs' model (with their count), else the CPU's."""
    if not gpus:
        return cpu
    models = sorted({gpu.split(",")[0].strip() for gpu in gpus})
    return " + ".join(models) if len(gpus) == 1 or len(models) > 1 else f"{len(gpus)} x {models[0]}"


def machine() -> dict:
    cpu, gpus = _cpu_model(), _gpus()
    return {"name": machine_name(cpu, gpus), "host": platform.node(), "os": platform.platform(), "cpu": cpu,
            "cpu_count": os.cpu_count(), "gpus": gpus, "python": platform.python_version(), "torch": _version("torch"),
            "transformers": _version("transformers")}


def results(bench: Benchmark, measured: Measured, root: Path, started: datetime) -> dict:
    state = git_state(root)
    return {
        "benchmark": bench.name, "goal": bench.goal, "metric": bench.metric, "value": measured.value,
        "goal_value": bench.goal_value, "higher_is_better": bench.higher_is_better,
        "met": bench.met(measured.value), "device": bench.device,
        "date": started.strftime("%Y-%m-%d"), "started": started.isoformat(timespec="seconds"),
        "commit": state["git.commit"], "dirty": state["git.dirty"], "machine": machine(),
        "command": measured.command, "setup": measured.setup, "wall_s": measured.wall_s,
        "numbers": measured.numbers, "records": measured.records, "kept": measured.kept,
        "reference": measured.reference,
    }


def write(out: Path, record: dict) -> Path:
    path = out / "results.json"
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    return path


def _metric_name(name: str) -> str:
    """MLflow's metric names allow letters, digits and `_-. /`."""
    return re.sub(r"[^A-Za-z0-9_\-. /]", "_", name)[:250]


def log_mlflow(record: dict, uri: str | None = None) -> str:
    """One finished run in the `benchmarks` experiment; returns its id."""
    from draftlab.tracking import runs as tracking

    client = tracking.open_client(uri)
    params = {"benchmark": record["benchmark"], "goal": record["goal"], "metric": record["metric"],
              "command": " ".join(record["command"]), "device": record["device"],
              **{f"machine.{k}": v for k, v in record["machine"].items()}}
    tags = {"git.commit": record["commit"], "git.dirty": record["dirty"], "benchmark": record["benchmark"],
            "benchmark.met": str(record["met"]).lower()}
    if record.get("reference"):
        tags["reference.commit"] = record["reference"]["commit"]
    metrics = {_metric_name(k): v for k, v in record["numbers"].items()}
    return tracking.import_job(client, EXPERIMENT, record["benchmark"], params, metrics, tags)


def print_table(record: dict, path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    met = {True: "met", False: "not met", None: ""}[record["met"]]
    table = Table(title=f"benchmark {record['benchmark']}", title_justify="left", caption_justify="left")
    table.add_column("number")
    table.add_column("value", justify="right")
    table.add_row(f"[bold]{record['metric']}[/bold] (deciding)", f"[bold]{record['value']:.6g}[/bold] {met}")
    others = sorted(k for k in record["numbers"] if k != record["metric"])
    for key in others[:MAX_TABLE_ROWS]:
        table.add_row(key, f"{record['numbers'][key]:.6g}")
    if len(others) > MAX_TABLE_ROWS:
        table.add_row(f"... {len(others) - MAX_TABLE_ROWS} more", "in results.json")
    compared = ""
    if record.get("reference"):
        ref = record["reference"]
        compared = (f"\n{ref['compare']} over the reference's {ref['metric']} "
                    f"(commit {ref['commit'][:12]}, same machine): {record['numbers']['ratio']:.3g}x")
    table.caption = (f"goal: {record['goal']}{compared}\n{record['machine']['name']} "
                     f"({record['machine']['host']}), commit {record['commit'][:12]}, {record['date']}\n{path}")
    Console(width=120).print(table)
