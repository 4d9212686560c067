"""benchmarks/host_load.py reads /proc/stat's first line into the shares of CPU time stolen and busy between two
snapshots: guest time (already inside user) is not counted twice, and a machine without /proc/stat gives None."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from conftest import BENCHMARKS, benchmark_script


def _host_load():
    return benchmark_script("host_load")


def _stat(path: Path, user, nice, system, idle, iowait, irq, softirq, steal, guest) -> str:
    path.write_text(f"cpu  {user} {nice} {system} {idle} {iowait} {irq} {softirq} {steal} {guest} 0\n"
                    f"cpu0 1 2 3 4 5 6 7 8 9 0\n")
    return str(path)


def test_shares_count_steal_and_busy_between_snapshots(tmp_path):
    host_load = _host_load()
    before = host_load.snapshot(_stat(tmp_path / "a", 100, 0, 50, 800, 10, 0, 0, 40, 30))
    # 1,000 ticks later: 300 user (of which 200 guest), 100 system, 400 idle, 200 stolen
    after = host_load.snapshot(_stat(tmp_path / "b", 400, 0, 150, 1200, 10, 0, 0, 240, 230))
    shares = host_load.shares(before, after)
    assert shares["steal"] == 0.2
    assert shares["busy"] == 0.4
    assert shares["seconds"] >= 0
    assert shares["probe_ms"] == [before["probe_ms"], after["probe_ms"]] and before["probe_ms"] > 0


def test_the_probe_times_more_loops_as_longer():
    host_load = _host_load()
    assert host_load.probe_ms(loops=400_000) > host_load.probe_ms(loops=20_000)


def test_no_proc_stat_gives_none(tmp_path):
    host_load = _host_load()
    assert host_load.snapshot(str(tmp_path / "missing")) is None
    assert host_load.shares(None, None) == {"steal": None, "busy": None, "seconds": None, "probe_ms": None}


def test_command_line_passes_the_output_through_and_adds_a_json_line():
    done = subprocess.run([sys.executable, str(BENCHMARKS / "host_load.py"), "--", sys.executable, "-c",
                           "print('hello')"], capture_output=True, text=True, check=True)
    first, last = done.stdout.splitlines()
    assert first == "hello"
    record = json.loads(last)
    assert record["rc"] == 0 and record["command"][-1] == "print('hello')"
    assert set(record["host_load"]) == {"steal", "busy", "seconds", "probe_ms"}
    started, ended = (time.strptime(c.split(".")[0], "%Y/%m/%d %H:%M:%S") for c in record["clock"])
    assert started <= ended
