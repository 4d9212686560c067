"""Start-up monitor and server lifecycle, against the stand-in server program (a test double, not SGLang)."""

import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from draftlab.util.reporting import RecordingReporter
from draftlab.sglang.monitor import (PhaseTracker, PortInUseError, ServerStartError, SGLangServer, exit_reason,
                                     free_port, group_alive)

STANDIN = str(Path(__file__).resolve().parents[1] / "standin_sglang_server.py")


def argv(port, *extra, spec=True):
    cmd = [sys.executable, STANDIN, "--model-path", "tiny-target", "--host", "127.0.0.1", "--port", str(port)]
    if spec:
        cmd += ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3"]
    return cmd + list(extra)


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_slow_start_reports_every_phase_with_times(tmp_path, caplog):
    caplog.set_level("INFO", logger="draftlab.sglang")
    port, reporter = free_port(), RecordingReporter()
    server = SGLangServer(argv(port, "--standin-phase-s", "0.3"), tmp_path / "server.log", port=port,
                          timeout_s=20, reporter=reporter, poll_s=0.05)
    with server:
        pgid = server.proc.pid
        assert server._health() == 200
    assert not group_alive(pgid)
    for phase in ("target_weights", "memory_pool", "draft_weights", "cuda_graph_target", "cuda_graph_draft",
                  "warmup"):
        assert reporter.last(f"bench/startup/{phase}_s") >= 0.2, phase
    assert reporter.last("bench/startup_s") >= 1.8
    assert "cuda_graph_draft -> warmup" in caplog.text
    assert "Load weight begin" in (tmp_path / "server.log").read_text()


def test_crash_fails_fast_with_phase_and_tail_and_no_process_left(tmp_path):
    port, pidfile = free_port(), tmp_path / "child.pid"
    server = SGLangServer(argv(port, "--standin-crash-at", "draft_weights", "--standin-child-pidfile", str(pidfile)),
                          tmp_path / "server.log", port=port, timeout_s=20, poll_s=0.05)
    t0 = time.monotonic()
    with pytest.raises(ServerStartError) as err:
        with server:
            pass
    assert time.monotonic() - t0 < 8
    assert err.value.phase == "memory_pool"  # the last phase that began before the crash
    assert "stand-in crash in draft_weights" in str(err.value)
    assert not group_alive(server.proc.pid)
    assert not pid_alive(int(pidfile.read_text()))


def test_hang_times_out_and_kills_the_group_even_if_sigterm_is_ignored(tmp_path):
    port, pidfile = free_port(), tmp_path / "child.pid"
    server = SGLangServer(argv(port, "--standin-never-ready", "--standin-ignore-sigterm",
                               "--standin-child-pidfile", str(pidfile)),
                          tmp_path / "server.log", port=port, timeout_s=2, poll_s=0.05, grace_s=0.5)
    t0 = time.monotonic()
    with pytest.raises(ServerStartError) as err:
        with server:
            pass
    assert time.monotonic() - t0 < 2 + 4
    assert err.value.phase == "warmup" and "not ready after 2 s" in str(err.value)
    assert not group_alive(server.proc.pid)
    assert not pid_alive(int(pidfile.read_text()))


def test_warmup_failure_is_a_crash(tmp_path):
    port = free_port()
    with pytest.raises(ServerStartError, match="warmup error"):
        with SGLangServer(argv(port, "--standin-crash-at", "warmup", "--standin-phase-s", "0.3"),
                          tmp_path / "s.log", port=port, timeout_s=20, poll_s=0.05):
            pass


def test_port_already_in_use_is_refused_before_launch(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        server = SGLangServer(argv(port), tmp_path / "s.log", port=port, timeout_s=5)
        with pytest.raises(PortInUseError, match="already in use"):
            server.start()
        assert server.proc is None


def test_exception_inside_the_block_still_stops_the_server(tmp_path):
    port = free_port()
    server = SGLangServer(argv(port, spec=False), tmp_path / "s.log", port=port, timeout_s=20, poll_s=0.05)
    with pytest.raises(KeyError):
        with server:
            raise KeyError("boom")
    assert not group_alive(server.proc.pid)


def test_argv_must_be_a_list(tmp_path):
    with pytest.raises(TypeError):
        SGLangServer("python -m sglang.launch_server", tmp_path / "s.log")


def test_tracker_accepts_old_and_new_capture_lines():
    t = PhaseTracker()
    t.feed("Load weight begin. avail mem=1 GB")
    t.feed("Capture cuda graph begin. This can take up to several minutes.")
    assert t.phase == "cuda_graph_target"
    t.feed("Capture draft cuda graph begin")
    assert t.phase == "cuda_graph_draft"
    t.feed("Capturing batches (bs=8 avail_mem=3 GB)")
    assert t.phase == "cuda_graph_draft"


def test_a_killed_server_is_named_by_its_signal():
    assert exit_reason(3) == "exited with status 3"
    assert exit_reason(-signal.SIGTERM) == "was killed by SIGTERM"
    killed = exit_reason(-signal.SIGKILL)  # what SGLang sends itself when a child fails, as does the OOM killer
    assert killed.startswith("was killed by SIGKILL") and "log tail" in killed and "out-of-memory" in killed
