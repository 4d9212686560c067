"""`src/run.py` refuses bad input in one console line with exit code 2, the traceback kept in the job's run.log:
a dead or wrong generation server, an unusable paths.root. A dead server is refused within seconds."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from conftest import REPO, tiny_overrides
from standin_http import not_found_server
from draftlab.serve.remote import RemoteGenerator, ServerError


def run_py(*overrides: str, multirun: bool = False) -> tuple[int, str, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(REPO / "src" / "run.py"), *(["-m"] if multirun else []), *overrides],
                          capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    return proc.returncode, (proc.stdout + proc.stderr).strip(), time.monotonic() - started


def one_line(console: str, key: str) -> str:
    assert "Traceback" not in console, console
    lines = [line for line in console.splitlines() if key in line]
    assert len(lines) == 1, console
    return lines[0]


def test_dead_server_url_is_refused_in_one_line_within_5_s(tmp_path):
    code, console, seconds = run_py(*tiny_overrides(tmp_path, "data.engine=server", "data.samples=8",
                                                    "data.server.url=http://127.0.0.1:9",
                                                    f"hydra.run.dir={tmp_path / 'job'}"))
    assert code == 2 and seconds < 5, (seconds, console)
    assert "config error: data.server.url: no server answers" in one_line(console, "data.server.url")
    assert "Traceback" in (tmp_path / "job" / "run.log").read_text()
    assert not (tmp_path / "out" / "generate").exists() and not (tmp_path / "mlflow.db").exists()


def test_a_server_that_is_not_sglang_or_vllm_is_one_line(tmp_path):
    with not_found_server() as url:
        code, console, _ = run_py(*tiny_overrides(tmp_path, "data.engine=server", "data.samples=8",
                                                  f"data.server.url={url}", "tracking.enabled=false",
                                                  f"hydra.run.dir={tmp_path / 'job'}"))
    assert code == 2, console
    assert "error: data.server.url:" in one_line(console, "is neither SGLang")
    assert "ServerError" in (tmp_path / "job" / "run.log").read_text()


@pytest.mark.parametrize("multirun", [False, True])
def test_unusable_paths_root_is_one_line(tmp_path, multirun):
    for root, clue in (("/proc/x", "cannot make /proc/x"), (str(tmp_path / "typo" / "deeper"), "does not exist")):
        code, console, _ = run_py("target=tiny", "data.samples=8", "tracking.enabled=false", f"paths.root={root}",
                                  multirun=multirun)
        assert code == 2, console
        assert clue in one_line(console, "paths.root")
    assert not (tmp_path / "typo").exists()


def test_made_paths_root_is_said_on_the_console(tmp_path):
    root = tmp_path / "new"
    code, console, _ = run_py("target=tiny", "data.samples=8", "stages=[generate]", "tracking.enabled=false",
                              f"paths.root={root}")
    assert code == 0, console
    assert f"paths.root: made the folder {root}" in console and (root / "generate").is_dir()


def test_a_server_that_never_answered_is_not_retried():
    client = RemoteGenerator("http://127.0.0.1:9", eos=[2], api="sglang", retries=2, backoff_s=2.0)
    started = time.monotonic()
    with pytest.raises(ServerError, match="data.server.url: no server answers at http://127.0.0.1:9"):
        client.answer_one([1, 2, 3], 4, 0.0, 0)
    assert time.monotonic() - started < 1
