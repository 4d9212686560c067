"""The issue's own train stage, window by window: issue 11's 80k tok/s is one 10-step log window of 5c67ce0's train
stage on 6,400 real samples (BENCHMARKS.md), so part 4 is settled by running that stage again on the machine that
runs today's, and reading both the same ways.

    python bench/issue_stage.py run --code .oldcode --log windows.jsonl -- OVERRIDE...   # the old code's src/run.py
    python bench/issue_stage.py read windows.jsonl [--results results.json] [--stated 80000]
    python bench/issue_stage.py pair ISSUE_RUN TODAY_RUN [ISSUE_RUN TODAY_RUN ...]

`run` runs CODE's `src/run.py` in this process with tracking off and its RecordingReporter also appending every
metrics call to LOG as a JSON line (`t`: the wall clock when it was reported, `step`, the values), so each log window
keeps its rate and time; the code itself is not changed. `read` prints the stage's rates from such a file:
- last_window: the last log window's rate (the issue's 80k is one such; the last window may be short);
- median_window: the median window's rate;
- steady: the windows' tokens over their seconds, leaving out the first window of each epoch (it holds the start,
  or the validation pass and the checkpoint at the epoch's end before it); the checkpoints every
  `train.checkpoint_every` steps stay in, as they do in any stage of that code;
- late: the same over the last epoch only. The issue's code speeds up through a run (each new batch shape costs it
  once), so its late rate is the nearest to where a long run of it settles;
- stage_mean (with --results): the stage's train tokens over its seconds, loading and passes included. It depends
  on the job's length (a fixed cost spread over its steps): compare it only between jobs of equal work.
`pair` reads each ISSUE_RUN (a folder holding one `issue_S.jsonl` and `issue_run_S/results.json`, as
h200_headline.sh's issue_stage packs them) beside a TODAY_RUN (a `small` job's folder) read the same ways: steady
and late by bench/stage_rate.py (between the second validation pass and the last, and over the last third of the
steps; the passes left out), stage_mean over the seconds from the stage's "running" log line to the next stage's,
last_window from its results' train/tokens_per_s; and prints today's rate over the issue's, pair by pair.
"""

from __future__ import annotations

import argparse
import json
import runpy
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stage_rate  # noqa: E402  (bench/stage_rate.py: today's stage read from its log)
from stage_rate import stage_seconds  # noqa: E402  (today's stage timed by its log lines)


def read_records(path: Path) -> list[dict]:
    """The JSON lines `run` wrote."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run(code: Path, log: Path, overrides: list[str]) -> None:
    """Run CODE's src/run.py with OVERRIDES, every reported metrics dict appended to LOG."""
    sys.path.insert(0, str(code / "src"))
    from draftlab import reporting  # the older code's, from the path just put first

    original = reporting.RecordingReporter.metrics

    def metrics(self, values, step=None):
        numbers = {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        with log.open("a") as out:
            out.write(json.dumps({"t": time.time(), "step": step, **numbers}) + "\n")
        return original(self, values, step)

    reporting.RecordingReporter.metrics = metrics
    script = code / "src" / "run.py"
    sys.argv = [str(script), "tracking.enabled=false", *overrides]
    runpy.run_path(str(script), run_name="__main__")


def windows(records: list[dict]) -> list[dict]:
    """The train log windows, in order. A window's seconds run from the report before it to its own (the trainer
    restarts its window clock right after each report), and its tokens are its rate times them: the record's
    `train/tokens` counts loss positions, not the attention mask's tokens that the rate is made of. `after_gap` marks
    the run's first window and each one after a validation pass (its seconds then hold the start, or the epoch's
    end: the pass and its checkpoint)."""
    found, gap, before = [], True, None
    for record in records:
        if "val/loss" in record and "train/tokens_per_s" not in record:
            gap = True
        elif "train/tokens_per_s" in record and "train/seconds" not in record:  # not the stage's closing metrics
            seconds = record["t"] - before if before is not None else float("nan")
            found.append({"step": record["step"], "epoch": record.get("epoch", 0.0), "seconds": seconds,
                          "tokens": record["train/tokens_per_s"] * seconds,
                          "tokens_per_s": record["train/tokens_per_s"], "after_gap": gap})
            gap = False
        before = record["t"]
    return found


def _rate(found: list[dict]) -> float | None:
    return sum(w["tokens"] for w in found) / sum(w["seconds"] for w in found) if found else None


def readings(records: list[dict], results: dict | None = None) -> dict:
    """The stage's rates (module docstring) from the records `run` wrote, and from its results.json's metrics."""
    found = windows(records)
    if not found:
        raise ValueError("no train log windows in the records")
    steady = [w for w in found if not w["after_gap"]]
    last_epoch = max(w["epoch"] for w in found)
    out = {"windows": len(found), "last_window": found[-1]["tokens_per_s"],
           "median_window": statistics.median(w["tokens_per_s"] for w in found), "steady": _rate(steady),
           "late": _rate([w for w in steady if w["epoch"] == last_epoch])}
    if results:
        out["stage_mean"] = results["train/train_tokens"] * (last_epoch + 1) / results["train/seconds"]
    return out


def today_readings(folder: Path) -> dict:
    """A `small` job's train stage read as `readings` reads the issue's (the module docstring, `pair`)."""
    log, metrics = stage_rate.read_run(folder)
    passes = sorted(stage_rate.passes(log))
    late_first = min(step for step in passes if step >= passes[-1] * 2 / 3)  # the last third of the steps
    seconds = stage_seconds(log) or metrics["train/seconds"]
    return {"steady": stage_rate.steady_rate(log, metrics)["tokens_per_s"],
            "late": stage_rate.steady_rate(log, metrics, first=late_first)["tokens_per_s"],
            "stage_mean": metrics["train/train_tokens"] * metrics["train/epochs_seen"] / seconds,
            "last_window": metrics["train/tokens_per_s"]}


def issue_readings(folder: Path) -> dict:
    """An issue_stage folder's readings: its one issue_S.jsonl and issue_run_S/results.json."""
    logs = sorted(folder.glob("issue_*.jsonl"))
    if len(logs) != 1:
        raise SystemExit(f"{folder}: needs one issue_*.jsonl, found {[p.name for p in logs]}")
    records = read_records(logs[0])
    results = folder / logs[0].name.replace("issue_", "issue_run_").replace(".jsonl", "") / "results.json"
    return readings(records, json.loads(results.read_text())["metrics"])


def pair(folders: list[Path]) -> None:
    if len(folders) % 2:
        raise SystemExit("pair takes ISSUE_RUN TODAY_RUN pairs: an even number of folders")
    keys, ratios = ("steady", "late", "stage_mean", "last_window"), []
    print("issue_run  today_run  " + "  ".join(f"{k}: issue today ratio" for k in keys))
    for old_dir, new_dir in zip(folders[::2], folders[1::2]):
        old, new = issue_readings(old_dir), today_readings(new_dir)
        ratios.append({k: new[k] / old[k] for k in keys})
        print(old_dir.name, new_dir.name, "  ".join(f"{k}: {old[k]:.0f} {new[k]:.0f} {new[k] / old[k]:.2f}x"
                                                    for k in keys))
    for k in keys:
        values = [r[k] for r in ratios]
        print(f"{k}: median {statistics.median(values):.2f}x, range {min(values):.2f}-{max(values):.2f}x "
              f"over {len(values)} pair(s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    go = sub.add_parser("run")
    go.add_argument("--code", type=Path, required=True, help="an older checkout holding src/run.py and conf/")
    go.add_argument("--log", type=Path, required=True)
    go.add_argument("overrides", nargs="*")
    read = sub.add_parser("read")
    read.add_argument("log", type=Path)
    read.add_argument("--results", type=Path, help="the job's results.json, for the stage's mean")
    read.add_argument("--stated", type=float, default=80_000)
    pairs = sub.add_parser("pair")
    pairs.add_argument("folders", nargs="+", type=Path)
    args = ap.parse_args()
    if args.command == "pair":
        pair(args.folders)
        return
    if args.command == "run":
        run(args.code.resolve(), args.log.resolve(), args.overrides)
        return
    records = read_records(args.log)
    results = json.loads(args.results.read_text())["metrics"] if args.results else None
    found = readings(records, results)
    print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in found.items()}))
    print(" ".join(f"{k} {v / args.stated:.2f}x" for k, v in found.items() if k != "windows" and v))


if __name__ == "__main__":
    main()
