"""How loaded the host was while a timed run ran: the share of CPU time stolen by the hypervisor and the share busy.

Cloud GPU machines are often virtual machines on a shared host. On 2026-12-04 one H200 machine ran the same plain
forward at 220k-464k tok/s and the reference's training step at 60.8k and then 86.0k tok/s, a spread larger than the
10% a comparison must resolve. A launch-bound run slows when the host takes its CPUs away, and /proc/stat's `steal`
counts exactly that time; recording it beside each timed run says which runs to distrust instead of guessing.
Linux only: elsewhere the snapshot is None and so are the shares.

Stolen time is not the whole story. On 2026-12-04 a machine that lost 0-0.8% of its CPU time ran the reference's step at
47-52k, then 78-95k, then 61-68k tok/s within 20 minutes, its GPU at the top clock and at most 54% busy where
sampled: a step set on the host's side slows when the host CPU does, and a neighbour on the
same cores or the CPU's own clock can do that without any steal. So each snapshot also times a fixed pure-Python
loop (`probe_ms`, best of three). It is a noisy measure: on another machine it moved 9.7-15.3 ms between snapshots
and did not track six runs of the step at 51-59k; read it beside the rate, not as a correction.

As a module: `snapshot()` before, `shares(before, snapshot())` after. As a command, around another one (run
without a shell; its output passes through, then one JSON line with the shares and the run's start and end in
local time, `clock`, in nvidia-smi's timestamp format):
    python3 benchmarks/host_load.py -- python3 benchmarks/train_throughput.py --preset smollm2 --batch-tokens 4096
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

# /proc/stat's first line: cpu user nice system idle iowait irq softirq steal guest guest_nice (in clock ticks);
# guest time is already inside user, so it is left out of the total
FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
CLOCK_FORMAT = "%Y/%m/%d %H:%M:%S.%f"  # nvidia-smi's timestamp (which stops at milliseconds)


def probe_ms(loops: int = 200_000, repeats: int = 3) -> float:
    """The fastest of `repeats` timings of a fixed pure-Python loop, in ms (8 ms on the dev machine, 10-15 ms on
    the rented H200 machines): the interpreter's speed on this host now, a proxy for a launch-bound step's Python."""
    best = math.inf
    for _ in range(repeats):
        started, total = time.perf_counter(), 0
        for i in range(loops):
            total += i & 7
        best = min(best, time.perf_counter() - started)
    return round(best * 1e3, 3)


def snapshot(path: str = "/proc/stat") -> dict | None:
    """The machine's CPU time so far by kind and `probe_ms`, or None where there is no /proc/stat."""
    try:
        first = Path(path).read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if first[0] != "cpu":
        return None
    times = {name: int(value) for name, value in zip(FIELDS, first[1:])}
    times["probe_ms"] = probe_ms()
    # after the probe, so the window between two snapshots holds the second one's probe (about 25 ms) and not the
    # first's: negligible against runs of seconds
    times["wall"] = time.monotonic()
    return times


def shares(before: dict | None, after: dict | None) -> dict:
    """Between two snapshots: `steal` (CPU time the hypervisor gave to others) and `busy` (user, system and
    interrupts: our own run's threads and anything else on the machine) as fractions of all CPU time, and the
    probe's timings before and after."""
    if before is None or after is None:
        return {"steal": None, "busy": None, "seconds": None, "probe_ms": None}
    delta = {name: after[name] - before[name] for name in FIELDS}
    total = sum(delta.values())
    busy = delta["user"] + delta["nice"] + delta["system"] + delta["irq"] + delta["softirq"]
    return {"steal": round(delta["steal"] / total, 4) if total > 0 else 0.0,
            "busy": round(busy / total, 4) if total > 0 else 0.0,
            "seconds": round(after["wall"] - before["wall"], 3),
            "probe_ms": [before.get("probe_ms"), after.get("probe_ms")]}


def local_clock() -> str:
    """The local time as `nvidia-smi --query-gpu=timestamp` writes it (CLOCK_FORMAT to the millisecond), so that a
    run's span can be cut out of a GPU sample log taken beside it (`nvidia-smi -lms`)."""
    return datetime.now().strftime(CLOCK_FORMAT)[:-3]


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "--" or len(argv) < 2:
        print("usage: python3 benchmarks/host_load.py -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    command = argv[1:]
    before = snapshot()
    started = local_clock()
    rc = subprocess.run(command, check=False).returncode
    ended = local_clock()
    print(json.dumps({"host_load": shares(before, snapshot()), "command": command, "rc": rc,
                      "clock": [started, ended]}), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
