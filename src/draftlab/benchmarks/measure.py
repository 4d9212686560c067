"""Runs a benchmark's commands and reads back its numbers.

Commands run from the checkout with its `src/` first on PYTHONPATH, so that what is measured is this checkout's
code whatever the environment has installed. Their output streams to stderr (the table goes to stdout) and is
kept in `output.txt` beside results.json.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from draftlab.benchmarks.declarations import Benchmark, commands, fill, main_command, reference_benchmark
from draftlab.tracking.run_context import repo_root


class BenchmarkFailed(RuntimeError):
    """A command exited non-zero, or the deciding metric did not come back."""


@dataclass
class Measured:
    command: list[str]
    setup: list[list[str]]
    wall_s: float
    records: list[dict] = field(default_factory=list)
    numbers: dict[str, float] = field(default_factory=dict)
    value: float | None = None
    kept: list[str] = field(default_factory=list)
    reference: dict | None = None


def _env(bench: Benchmark, root: Path, out: Path, head: Path) -> dict[str, str]:
    env = dict(os.environ)
    # root's src/ replaces, not precedes, the caller's own src/ on PYTHONPATH: a reference worktree must not
    # import this checkout's modules where its own lack one
    own_src = Path(head).resolve() / "src"
    inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != own_src]
    env["PYTHONPATH"] = os.pathsep.join([str(root / "src"), *inherited])
    env.update({key: fill(str(value), out, root, head) for key, value in bench.env.items()})
    return env


def run_command(argv: list[str], root: Path, env: dict[str, str], log) -> tuple[int, str]:
    """Runs `argv` (no shell), echoing its output to stderr and to `log`; returns (exit code, stdout+stderr)."""
    lines = []
    log.write("$ " + " ".join(argv) + "\n")
    with subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1) as proc:
        for line in proc.stdout:
            lines.append(line)
            log.write(line)
            sys.stderr.write(line)
    return proc.returncode, "".join(lines)


def json_records(text: str) -> list[dict]:
    """Every line of `text` that is a JSON object."""
    records = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                records.append(value)
    return records


def flat_numbers(record: dict, prefix: str = "") -> dict[str, float]:
    """The finite numbers of a record, nested keys and list indices joined by dots; booleans as 0/1."""
    numbers: dict[str, float] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            numbers.update(flat_numbers(value, name + "."))
        elif isinstance(value, list):
            numbers.update(flat_numbers({str(i): v for i, v in enumerate(value)}, name + "."))
        elif isinstance(value, (bool, int, float)) and math.isfinite(float(value)):
            numbers[name] = float(value)
    return numbers


def deciding_record(bench: Benchmark, records: list[dict]) -> dict | None:
    """The last record whose fields equal `select`'s."""
    chosen = [r for r in records if all(r.get(k) == v for k, v in bench.select.items())]
    return chosen[-1] if chosen else None


def newest_results(bench: Benchmark, out: Path) -> dict | None:
    found = sorted(out.glob(bench.results_glob), key=lambda p: p.stat().st_mtime)
    return json.loads(found[-1].read_text()) if found else None


def keep_files(bench: Benchmark, out: Path) -> list[str]:
    """The newest match of each `keep` pattern under `out`, copied into `out` beside results.json; their names.
    A pattern that matches nothing raises BenchmarkFailed: the result would lack what re-derives it."""
    kept = []
    for pattern in bench.keep:
        found = sorted((p for p in out.glob(pattern) if p.is_file() and p.parent != out), key=lambda p: p.stat().st_mtime)
        if not found:
            raise BenchmarkFailed(f"benchmark {bench.name}: nothing under {out} matches keep pattern {pattern!r}")
        shutil.copy2(found[-1], out / found[-1].name)
        kept.append(found[-1].name)
    return kept


def _run_and_read(bench: Benchmark, out: Path, root: Path, head: Path) -> Measured:
    """Runs the setup, then the measured command (timed), and reads its numbers. Raises BenchmarkFailed."""
    out.mkdir(parents=True, exist_ok=True)
    env = _env(bench, root, out, head)
    setup, raw = commands(bench, out, root, head)
    with open(out / "output.txt", "w") as log:
        for argv in setup:
            code, _ = run_command(argv, root, env, log)
            if code:
                raise BenchmarkFailed(f"setup command exited {code}: {' '.join(argv)} (output: {out / 'output.txt'})")
        argv = main_command(raw, out, root, head)
        start = time.perf_counter()
        code, text = run_command(argv, root, env, log)
        wall = time.perf_counter() - start
    if code:
        raise BenchmarkFailed(f"command exited {code}: {' '.join(argv)} (output: {out / 'output.txt'})")
    result = Measured(command=argv, setup=setup, wall_s=round(wall, 3))
    if bench.read == "json_lines":
        result.records = json_records(text)
        record = deciding_record(bench, result.records)
        result.numbers = flat_numbers(record) if record else {}
    else:
        record = newest_results(bench, out)
        result.records = [record] if record else []
        result.numbers = flat_numbers(record.get("metrics", {})) if record else {}
    result.numbers["command_wall_s"] = result.wall_s
    return result


def _git(argv: list[str], cwd: Path) -> str:
    done = subprocess.run(["git", *argv], cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise BenchmarkFailed(f"git {' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout.strip()


def measure_reference(bench: Benchmark, out: Path, root: Path) -> dict:
    """Runs `bench`'s reference in a detached worktree of its commit (removed afterwards); returns what
    results.json records of it: the full commit, command, seconds, numbers and the deciding reference number."""
    ref = reference_benchmark(bench)
    commit = _git(["rev-parse", "--verify", f"{bench.reference['commit']}^{{commit}}"], root)
    parent = Path(tempfile.mkdtemp(prefix="draftlab-reference-"))
    tree = parent / commit[:12]
    _git(["worktree", "add", "--detach", str(tree), commit], root)
    try:
        measured = _run_and_read(ref, out / "reference", tree, root)
    finally:
        _git(["worktree", "remove", "--force", str(tree)], root)
        shutil.rmtree(parent, ignore_errors=True)
    value = measured.numbers.get(ref.metric)
    if value is None:
        raise BenchmarkFailed(f"benchmark {bench.name}: the reference ({commit[:12]}) gave no {ref.metric!r} "
                              f"(output: {out / 'reference' / 'output.txt'})")
    return {"commit": commit, "metric": ref.metric, "value": value, "command": measured.command,
            "setup": measured.setup, "wall_s": measured.wall_s, "numbers": measured.numbers,
            "records": measured.records}


def measure(bench: Benchmark, out: Path, root: Path | None = None) -> Measured:
    """Runs the setup, then the measured command (timed), and reads its numbers; then the reference, if declared,
    and the ratio of the two. Raises BenchmarkFailed."""
    root = root or repo_root()
    result = _run_and_read(bench, out, root, root)
    result.kept = keep_files(bench, out)
    if bench.reference is not None:
        compare = bench.reference.get("compare") or (
            bench.reference["metric"] if bench.metric == "ratio" else bench.metric)
        ours = result.numbers.get(compare)
        if ours is None:
            raise BenchmarkFailed(f"benchmark {bench.name}: the command gave no {compare!r} to compare "
                                  f"(output: {out / 'output.txt'})")
        result.reference = measure_reference(bench, out, root)
        result.reference["compare"] = compare
        result.numbers.update({f"reference.{k}": v for k, v in result.reference["numbers"].items()})
        result.numbers["ratio"] = ours / result.reference["value"] if result.reference["value"] else math.inf
    result.value = result.numbers.get(bench.metric)
    if result.value is None:
        raise BenchmarkFailed(f"benchmark {bench.name}: the command gave no {bench.metric!r} "
                              f"(output: {out / 'output.txt'})")
    return result
