"""`python src/analyze.py <experiment or parent run id>`: load a sweep from MLflow, analyse, print, log back.

`--report docs/<name>.md` writes the report there and its plots into `docs/<name>_figures/`: a document made
from the records, so that no number in it is typed by hand. `--records FILE` reads the records from a JSON or
JSON-lines file (the format of `draftlab.analysis.records`) instead of MLflow.

`analyze_parent` is the entry the sweep callback (draftlab.tracking.sweep) calls when a multirun ends.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from draftlab.util.cli_parser import ArgumentParser
from draftlab.analysis.core import AnalysisResult, analyze
from draftlab.tracking.mlflow_source import load_records, log_to_parent
from draftlab.analysis.records import read_records
from draftlab.tracking.run_context import repo_root


def default_out(parent_run_id: str) -> Path:
    return repo_root() / "outputs" / "analysis" / parent_run_id


def analyze_parent(source: str, tracking_uri: str | None = None, out: Path | None = None,
                   log: bool = True, include_unfinished: bool = False, seed: int = 0,
                   n_boot: int = 400, level: float = 0.9, allow_mixed_code: bool = False,
                   report: Path | None = None, command: str = "") -> AnalysisResult:
    """Analyses the sweep `source` (parent run id or experiment name); logs to the parent run when `log`."""
    sweep = load_records(source, tracking_uri, include_unfinished=include_unfinished)
    result = analyze(sweep.records, out or default_out(sweep.parent_run_id), level=level, n_boot=n_boot,
                     seed=seed, allow_mixed_code=allow_mixed_code, report_path=report, command=command)
    if sweep.skipped:
        note = f"Left out {len(sweep.skipped)} unfinished child run(s): {', '.join(sweep.skipped)}."
        result.evidence.append(note)
        result.report += f"\n{note}\n"
    if log:
        log_to_parent(sweep.parent_run_id, result, tracking_uri)
    result.parent_run_id = sweep.parent_run_id
    return result


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="analyze.py", description="Is this draft under-trained, data-limited, or at a "
                       "bottleneck? Measures the sweep's children along optimizer steps and training "
                       "tokens, prices the next doubling of each, and names the verdict.")
    p.add_argument("source", help="a sweep's parent run id, or an experiment name (its latest sweep)")
    p.add_argument("--tracking-uri", default=None,
                   help="default: MLFLOW_TRACKING_URI, else sqlite:///<repo>/mlruns/mlflow.db")
    p.add_argument("--out", type=Path, default=None, help="report + plots folder "
                   "(default: outputs/analysis/<parent run id>)")
    p.add_argument("--log-to-parent", action="store_true",
                   help="log the report, plots, analysis/* metrics and a verdict tag to the parent run")
    p.add_argument("--include-unfinished", action="store_true", help="also use failed or running children")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (results are deterministic per seed)")
    p.add_argument("--boot", type=int, default=400, help="bootstrap replicates")
    p.add_argument("--level", type=float, default=0.9, help="interval level")
    p.add_argument("--report", type=Path, default=None, help="write the report to this Markdown file (e.g. "
                   "docs/<name>.md) and its plots into <name>_figures/ beside it")
    p.add_argument("--records", type=Path, default=None, help="read the records from this JSON / JSON-lines file "
                   "(.gz: compressed; `import-runs --records` writes one) instead of MLflow (the source then only "
                   "names the sweep)")
    p.add_argument("--allow-mixed-code", action="store_true", help="compare runs whose train or extract code "
                   "differs (otherwise the verdict refuses to call their differences resolved)")
    args = p.parse_args(argv)
    if args.boot < 1 or not 0 < args.level < 1:  # refused before any store is opened or folder made
        print(f"analyze.py: {'--boot' if args.boot < 1 else '--level'}: "
              f"{args.boot if args.boot < 1 else args.level}; --boot at least 1, --level in (0, 1)", file=sys.stderr)
        return 2
    command = "python src/analyze.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    try:
        if args.records is not None:
            if args.log_to_parent:
                raise ValueError("--log-to-parent needs a sweep in MLflow, not --records")
            records = read_records(args.records)
            if not records:
                raise ValueError(f"--records {args.records}: holds no job records")
            result = analyze(records, args.out or default_out(args.source), level=args.level,
                             n_boot=args.boot, seed=args.seed, allow_mixed_code=args.allow_mixed_code,
                             report_path=args.report, command=command if args.report else "")
        else:
            result = analyze_parent(args.source, args.tracking_uri, args.out, log=args.log_to_parent,
                                    include_unfinished=args.include_unfinished, seed=args.seed, n_boot=args.boot,
                                    level=args.level, allow_mixed_code=args.allow_mixed_code, report=args.report,
                                    command=command if args.report else "")
    except (ValueError, FileNotFoundError) as err:
        print(f"analyze.py: {err}", file=sys.stderr)
        return 2
    print(result.report)
    print(f"\nReport and plots: {result.paths['report'].parent}")
    if args.log_to_parent:
        print(f"Logged to parent run {result.parent_run_id} (tag verdict={result.tag})")
    return 0
