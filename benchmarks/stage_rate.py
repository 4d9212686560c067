"""The train stage's steady training rate, read from a job's log: tokens a second between two validation passes,
with the passes' own seconds left out. The throughput goal is 5x the reference's 80k tok/s, which was its train
stage's rate on real generated samples (one log window of 5c67ce0's 6,400-sample job: BENCHMARKS.md), so a job's
train stage on real samples is read the same way here.

    python benchmarks/stage_rate.py RUN... [--first STEP] [--last STEP] [--stated 80000] [--json OUT.jsonl]

RUN: a folder holding a job's results.json (or small/results.json) and its log
(log-small.txt, else the one log*.txt). The span runs from the pass logged at --first (default: the second pass,
so that neither graph's load from the compile cache, at step 1 and in the first pass, is in it) to the pass at
--last (default: the last); its tokens are (last - first) steps of train/train_tokens x train/epochs_seen /
train/steps each, as the stage counts train/mean_tokens_per_s (prompt and answer tokens). The epochs' ends
(checkpoints on a thread), log windows and waits for batches stay in, as in any stage. A pass's seconds are printed
to 0.1 s, so the rate without them is good to about 0.05 s a pass.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
from pathlib import Path

TIME = r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)\]"  # the stamp that starts each line of Hydra's job log
PASS = re.compile(TIME + r"\[draftlab\]\[INFO\] - train: step (\d+) val/loss .*, a ([\d.]+) s pass")
STAGE = re.compile("^" + TIME + r"\[draftlab\.pipeline\]\[INFO\] - stage (\w+): running", re.MULTILINE)


def log_time(stamp: str) -> float:
    """A log line's time (TIME's group) in seconds."""
    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def passes(log_text: str) -> dict[int, tuple[float, float]]:
    """{step: (the pass's log time in seconds, the pass's own seconds)} for each validation pass the log holds."""
    return {int(step): (log_time(when), float(seconds)) for when, step, seconds in PASS.findall(log_text)}


def stage_seconds(log_text: str) -> float | None:
    """The train stage's seconds by the log, from its "running" line to the next stage's (None when no stage
    follows it): its train/seconds starts after the stage's module is imported (about 3.7 s on an H100), where
    5c67ce0's started before, so the log lines time both codes the same way."""
    lines = STAGE.findall(log_text)
    names = [name for _, name in lines]
    if "train" not in names or names.index("train") + 1 >= len(names):
        return None
    at = names.index("train")
    return log_time(lines[at + 1][0]) - log_time(lines[at][0])


def steady_rate(log_text: str, metrics: dict, first: int | None = None, last: int | None = None) -> dict:
    """The rate between the passes at steps `first` and `last` (module docstring), with and without the passes."""
    logged = passes(log_text)
    steps = sorted(logged)
    if len(steps) < 2:
        raise ValueError(f"the log holds {len(steps)} validation pass(es): two are needed to time a span")
    if first is None:  # the second pass: the first one loaded validation's graph
        first = steps[1] if len(steps) > 2 else steps[0]
    last = steps[-1] if last is None else last
    for step in (first, last):
        if step not in logged:
            raise ValueError(f"no validation pass logged at step {step} (passes at {steps})")
    if last <= first:
        raise ValueError(f"--last ({last}) must come after --first ({first})")
    per_step = metrics["train/train_tokens"] * metrics["train/epochs_seen"] / metrics["train/steps"]
    span = logged[last][0] - logged[first][0]
    in_passes = sum(seconds for step, (_, seconds) in logged.items() if first < step <= last)
    tokens = (last - first) * per_step
    return {"first": first, "last": last, "tokens_per_step": per_step, "span_s": span, "passes_s": in_passes,
            "tokens_per_s_with_passes": tokens / span, "tokens_per_s": tokens / (span - in_passes)}


def read_run(folder: Path) -> tuple[str, dict]:
    """A run folder's log text and results.json metrics."""
    results = next((p for p in (folder / "results.json", folder / "small" / "results.json") if p.is_file()), None)
    logs = [folder / "log-small.txt"] if (folder / "log-small.txt").is_file() else sorted(folder.glob("log*.txt"))
    if results is None or len(logs) != 1:
        raise SystemExit(f"{folder}: needs results.json (or small/results.json) and one log*.txt; found "
                         f"{results}, {[str(p) for p in logs]}")
    return logs[0].read_text(errors="replace"), json.loads(results.read_text())["metrics"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--first", type=int, help="the step of the pass the span starts at (default: the second pass)")
    ap.add_argument("--last", type=int, help="the step of the pass the span ends at (default: the last pass)")
    ap.add_argument("--stated", type=float, default=80_000, help="the rate to divide by (the reference's 80k)")
    ap.add_argument("--json", type=Path, help="also append one JSON line a run here")
    args = ap.parse_args()
    print(f"run                tokens/step  span_s  passes_s  tok/s_with_passes  tok/s_without  x_{args.stated:.0f}")
    rates = []
    for folder in args.runs:
        row = {"run": folder.name, **steady_rate(*read_run(folder), args.first, args.last)}
        rates.append(row["tokens_per_s"])
        print(f"{folder.name:18s} {row['tokens_per_step']:11.0f} {row['span_s']:7.2f} {row['passes_s']:9.1f} "
              f"{row['tokens_per_s_with_passes']:18.0f} {row['tokens_per_s']:14.0f} "
              f"{row['tokens_per_s'] / args.stated:6.2f}")
        if args.json:
            with args.json.open("a") as out:
                out.write(json.dumps(row) + "\n")
    median = statistics.median(rates)
    print(f"median {median:.0f} tok/s without the passes ({median / args.stated:.2f}x {args.stated:.0f}), range "
          f"{min(rates):.0f}-{max(rates):.0f} over {len(rates)} run(s)")


if __name__ == "__main__":
    main()
