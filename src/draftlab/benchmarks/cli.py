"""python -m draftlab benchmark --list | NAME [overrides...] [--out DIR] [--no-tracking] [--tracking-uri URI]

Runs one declared benchmark (conf/benchmark/NAME.yaml) and records it: results.json in its folder (by default
outputs/benchmarks/NAME/<time>/), a run in the MLflow experiment `benchmarks`, and a table on stdout.
Overrides use Hydra's syntax on the declaration: `args.steps=20`, `goal_value=0.5`, `+args.profile=out.txt`;
`hardware=gpu` picks NAME's GPU declaration (`peers hardware=gpu` runs `peers_gpu`).
"""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path

from draftlab.util.cli_parser import ArgumentParser
from draftlab.benchmarks import declarations, record
from draftlab.benchmarks.measure import BenchmarkFailed, measure
from draftlab.tracking.run_context import repo_root


def list_benchmarks(root: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="benchmarks (python -m draftlab benchmark NAME)")
    for column in ("name", "device", "deciding metric", "goal"):
        table.add_column(column)
    for name in declarations.names(root):
        bench = declarations.compose(name, root=root)
        table.add_row(name, bench.device, bench.metric, bench.goal)
    Console(width=160).print(table)


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="python -m draftlab benchmark", description=__doc__.splitlines()[0])
    parser.add_argument("name", nargs="?", help="a declared benchmark (--list shows them)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the declaration")
    parser.add_argument("--list", action="store_true", help="list the declared benchmarks")
    parser.add_argument("--out", type=Path, help="the run's folder (default outputs/benchmarks/NAME/<time>)")
    parser.add_argument("--no-tracking", action="store_true", help="write results.json only, no MLflow run")
    parser.add_argument("--tracking-uri", help="the MLflow store (default as for runs: tracking.uri's default)")
    args = parser.parse_args(argv)
    root = repo_root()
    if args.list:
        list_benchmarks(root)
        return 0
    if not args.name:
        parser.print_usage(sys.stderr)
        return 2
    try:
        bench = declarations.compose(args.name, args.overrides, root=root)
    except ValueError as err:
        print(f"benchmark: {err}", file=sys.stderr)
        return 2
    if declarations.missing(bench):
        print(f"benchmark {bench.name} needs {', '.join(declarations.missing(bench))}=...", file=sys.stderr)
        return 2
    started = datetime.now(timezone.utc)
    out = (args.out or root / "outputs" / "benchmarks" / bench.name / started.strftime("%Y-%m-%d_%H-%M-%S")).resolve()
    try:
        measured = measure(bench, out, root)
    except (BenchmarkFailed, FileNotFoundError) as err:
        print(f"benchmark {bench.name} failed: {err}", file=sys.stderr)
        return 1
    result = record.results(bench, measured, root, started)
    path = record.write(out, result)
    if not args.no_tracking:
        result["mlflow_run_id"] = record.log_mlflow(result, args.tracking_uri)
        record.write(out, result)
    record.print_table(result, path)
    return 0
