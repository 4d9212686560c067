"""bench/gpu_util_runs.py cuts each wrapped run's span out of an nvidia-smi sample log: only the samples inside the
span count, the run's rate comes from its own line, and a malformed log names its line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import BENCH, bench_script

HEADER = ("timestamp, clocks.current.sm [MHz], utilization.gpu [%], power.draw [W], "
          "clocks_event_reasons.active\n")


def _smi(path, rows) -> str:
    path.write_text(HEADER + "".join(f"2026/12/04 15:46:{sec:06.3f}, {mhz} MHz, {util} %, 80.00 W, 0x0\n"
                                     for sec, mhz, util in rows))
    return str(path)


def _runs():
    return [{"run": "issue", "tokens_per_s": 50000.0},
            {"run": "issue_load", "host_load": {"probe_ms": [10.0, 11.0]},
             "clock": ["2026/12/04 15:46:01.000", "2026/12/04 15:46:04.000"]},
            {"run": "issue", "tokens_per_s": 90000.0},
            {"run": "issue_load", "host_load": {"probe_ms": [9.0, 9.5]},
             "clock": ["2026/12/04 15:46:05.000", "2026/12/04 15:46:08.000"]}]


def test_each_run_gets_the_samples_inside_its_span(tmp_path):
    gpu = bench_script("gpu_util_runs")
    # run 1: idle start-up, then 40% and 60% busy; a sample between the runs (99%) belongs to neither
    samples = gpu.read_samples(_smi(tmp_path / "smi.csv", [(0.5, 1980, 97), (1.5, 345, 0), (2.5, 1980, 40),
                                                           (3.5, 1980, 60), (4.5, 1980, 99), (6.0, 1980, 20),
                                                           (7.0, 1800, 30)]))
    first, second = gpu.runs_with_gpu(_runs(), samples)
    assert first == {"run": "issue", "tokens_per_s": 50000.0, "probe_ms": [10.0, 11.0], "samples": 3,
                     "busy_samples": 2, "busy_util_mean": 50.0, "util_max": 60.0, "busy_sm_mhz_mean": 1980}
    assert second["tokens_per_s"] == 90000.0 and second["samples"] == 2
    assert second["busy_util_mean"] == 25.0 and second["util_max"] == 30.0 and second["busy_sm_mhz_mean"] == 1890


def test_a_run_with_no_samples_says_none_and_a_bad_line_is_named(tmp_path):
    gpu = bench_script("gpu_util_runs")
    empty = gpu.runs_with_gpu(_runs()[:2], [])
    assert empty[0]["samples"] == 0 and empty[0]["busy_util_mean"] is None and empty[0]["util_max"] is None
    bad = tmp_path / "bad.csv"
    bad.write_text(HEADER + "2026/12/04 15:46:01.000, fast, 3 %, 80 W, 0x0\n")
    with pytest.raises(ValueError, match="line 2"):
        gpu.read_samples(str(bad))


def test_command_line_prints_a_line_per_run(tmp_path):
    runs = tmp_path / "runs.jsonl"
    runs.write_text("".join(json.dumps(line) + "\n" for line in _runs()))
    smi = _smi(tmp_path / "smi.csv", [(2.0, 1980, 45)])
    done = subprocess.run([sys.executable, str(BENCH / "gpu_util_runs.py"), str(runs), smi],
                          capture_output=True, text=True, check=True)
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["tokens_per_s"] for r in records] == [50000.0, 90000.0]
    assert [r["util_max"] for r in records] == [45.0, None]
