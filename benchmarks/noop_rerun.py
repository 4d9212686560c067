"""Wall time of an all-cached `python src/run.py ...` (goal: 3 s or less, median of 5).

    python benchmarks/noop_rerun.py [--runs 5] [--python PY] -- src/run.py [overrides...]

The command is run once to make sure every stage is cached (that run is not timed), then `--runs` times; each
timed run must log every stage as cached, else the measurement is refused. Prints each time and the median.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import os
import subprocess
import sys
import time


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str]) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, output). CPU time is reported too because the project machine is shared:
    under load the wall time grows with the other work, the CPU time much less."""
    started, cpu = time.perf_counter(), _children_cpu()
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return seconds, _children_cpu() - cpu, result.stdout + result.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- src/run.py [overrides...]")
    args = parser.parse_args()
    command = [args.python, *[a for a in args.command if a != "--"]]
    timed(command)  # fills the caches
    walls, cpus = [], []
    for _ in range(args.runs):
        seconds, cpu, log = timed(command)
        if ": running in " in log:
            raise SystemExit(f"a stage ran instead of being cached:\n{log[-2000:]}")
        walls.append(seconds)
        cpus.append(cpu)
        print(f"wall {seconds:.2f} s, cpu {cpu:.2f} s, load {os.getloadavg()[0]:.1f}", flush=True)
    print(f"median of {args.runs}: wall {statistics.median(walls):.2f} s, cpu {statistics.median(cpus):.2f} s "
          f"({' '.join(command)})")
    print(json.dumps({"runs": args.runs, "median_wall_s": round(statistics.median(walls), 3),
                      "median_cpu_s": round(statistics.median(cpus), 3), "walls_s": [round(w, 3) for w in walls]}))


if __name__ == "__main__":
    main()
