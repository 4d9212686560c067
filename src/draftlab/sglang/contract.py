"""Runs `contract_probe.py` (real SGLang code) in the separate sglang venv and compares it with `keymap`.

The venv comes from scripts/setup-sglang.sh (default `.venv-sglang` at the repository root, or
$DRAFTLAB_SGLANG_PYTHON naming its interpreter). Without it, `sglang_python()` returns None and callers skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

PROBE = Path(__file__).with_name("contract_probe.py")
REPO = Path(__file__).resolve().parents[3]


def sglang_python() -> Path | None:
    explicit = os.environ.get("DRAFTLAB_SGLANG_PYTHON")
    candidate = Path(explicit) if explicit else REPO / ".venv-sglang" / "bin" / "python"
    return candidate if candidate.exists() else None


def run_probe(jobs: list[dict], python: Path | None = None, timeout_s: float = 600.0) -> list[dict]:
    """Runs the jobs in one interpreter (importing sglang costs ~20 s on a small CPU); returns their results."""
    python = python or sglang_python()
    if python is None:
        raise FileNotFoundError("no sglang venv: run scripts/setup-sglang.sh (or set DRAFTLAB_SGLANG_PYTHON)")
    with tempfile.TemporaryDirectory() as tmp:
        jobs_path = Path(tmp) / "jobs.json"
        jobs_path.write_text(json.dumps(jobs))
        env = dict(os.environ, PYTHONWARNINGS="ignore", SGLANG_LOGGING_LEVEL="warning")
        done = subprocess.run([str(python), str(PROBE), str(jobs_path)], capture_output=True, text=True,
                              timeout=timeout_s, env=env, cwd=tmp)
    for line in done.stdout.splitlines():
        if line.startswith("PROBE_RESULT "):
            return json.loads(line[len("PROBE_RESULT "):])
    raise RuntimeError(f"sglang probe failed (exit {done.returncode}):\n{done.stderr[-4000:]}")


def server_argv_for_probe(argv: list[str]) -> list[str]:
    """Our launch argv minus `python -m sglang.launch_server`: what SGLang's own parser receives."""
    if len(argv) >= 3 and argv[1:3] == ["-m", "sglang.launch_server"]:
        return argv[3:]
    return argv
