"""What the GPU did during each run that bench/host_load.py wrapped: joins a JSON-lines log of runs (each run's line,
then its `NAME_load` line with `clock`, the run's span) with an `nvidia-smi --query-gpu=timestamp,...
--format=csv -lms N` log sampled beside them, as bench/h200_train_vs_issue.sh writes both.

Why: on 2026-12-04 one machine ran the issue's step at 47-52k, then 78-95k, then 61-68k tok/s with 0-0.8% of its CPU
time stolen (BENCHMARKS.md, twenty-third session). If a slow run kept the GPU as busy as a fast one, the GPU's own
work slowed; if the GPU was idler, the host's side did. A run's whole span includes its start-up (model building,
seconds with the GPU idle), so the busy samples' mean and the busiest sample are reported, not the plain mean.

    python3 bench/gpu_util_runs.py OUT/train_vs_issue.jsonl OUT/train_vs_issue_smi.csv
prints one JSON line per wrapped run: its name, tokens_per_s (from the run's own line before it, if any),
probe_ms, and the GPU's samples within its span (count, busy count, busy mean and max utilisation, mean SM clock
while busy).
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_load import CLOCK_FORMAT  # noqa: E402  (the format of both logs' times)


def read_samples(path: str) -> list[dict]:
    """The nvidia-smi CSV's rows as {time, util, sm_mhz}: columns found by name, units stripped."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f, skipinitialspace=True))
    if not rows:
        return []
    header = [name.strip() for name in rows[0]]
    try:
        at = {key: header.index(name) for key, name in
              (("time", "timestamp"), ("util", "utilization.gpu [%]"), ("sm", "clocks.current.sm [MHz]"))}
    except ValueError as err:
        raise ValueError(f"{path}: header {header} lacks a column bench/h200_train_vs_issue.sh samples ({err})")
    samples = []
    for number, row in enumerate(rows[1:], start=2):
        if len(row) < len(header):  # the sampler killed mid-line
            continue
        try:
            samples.append({"time": datetime.strptime(row[at["time"]].strip(), CLOCK_FORMAT),
                            "util": float(row[at["util"]].split()[0]),
                            "sm_mhz": float(row[at["sm"]].split()[0])})
        except ValueError as err:
            raise ValueError(f"{path}, line {number}: {err}")
    return samples


def runs_with_gpu(run_lines: list[dict], samples: list[dict]) -> list[dict]:
    """One record per `*_load` line that has a `clock`: the run's rate (its own line just before) and the GPU's
    samples within the span."""
    out, previous = [], None
    for line in run_lines:
        if "clock" not in line:
            previous = line
            continue
        start, end = (datetime.strptime(stamp, CLOCK_FORMAT) for stamp in line["clock"])
        inside = [s for s in samples if start <= s["time"] <= end]
        busy = [s for s in inside if s["util"] > 0]
        name = line.get("run", "run").removesuffix("_load")
        rate = previous.get("tokens_per_s") if previous and previous.get("run") == name else None
        out.append({"run": name, "tokens_per_s": rate, "probe_ms": line.get("host_load", {}).get("probe_ms"),
                    "samples": len(inside), "busy_samples": len(busy),
                    "busy_util_mean": round(statistics.fmean(s["util"] for s in busy), 1) if busy else None,
                    "util_max": max((s["util"] for s in inside), default=None),
                    "busy_sm_mhz_mean": round(statistics.fmean(s["sm_mhz"] for s in busy)) if busy else None})
        previous = None
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python3 bench/gpu_util_runs.py RUNS.jsonl NVIDIA_SMI.csv", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        lines = [json.loads(text) for text in f if text.strip()]
    for record in runs_with_gpu(lines, read_samples(argv[1])):
        print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
