"""Runs `contract_probe.py` (real SGLang code) in the separate sglang venv and compares it with `keymap`.

The venv comes from scripts/setup-sglang.sh (default `.venv-sglang` at the repository root, or
$DRAFTLAB_SGLANG_PYTHON naming its interpreter). Without it, `sglang_python()` returns None and callers skip.
Older SGLang releases sit beside it as source only (`<venv>/sglang-<version>/`, scripts/sglang-source.sh): the
venv's interpreter runs them with that folder first on PYTHONPATH. $DRAFTLAB_SGLANG_SOURCES names another folder
holding such `sglang-<version>/` trees.
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


def installed_sglang(python: Path) -> tuple[Path, str]:
    """The package folder and version of the sglang installed for `python`, found without importing sglang."""
    code = ("import importlib.metadata as m, importlib.util as u, pathlib; s = u.find_spec('sglang'); "
            "print(pathlib.Path(list(s.submodule_search_locations)[0])); print(m.version('sglang'))")
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True, timeout=120)
    folder, version = done.stdout.split()
    return Path(folder), version


def sglang_sources(python: Path | None = None) -> dict[str, tuple[Path, str | None]]:
    """version -> (its `sglang` package folder, the PYTHONPATH that runs it with the venv's interpreter; None for
    the installed one), for the venv's own sglang and every unpacked `sglang-<version>/` beside it."""
    python = python or sglang_python()
    if python is None:
        return {}
    folder, version = installed_sglang(python)
    found = {version: (folder, None)}
    where = Path(os.environ.get("DRAFTLAB_SGLANG_SOURCES") or python.parent.parent)  # not resolved: a venv link
    for root in sorted(where.glob("sglang-*")):
        if (root / "sglang" / "srt" / "models").is_dir():
            found.setdefault(root.name.removeprefix("sglang-"), (root / "sglang", str(root)))
    return found


def run_probe(jobs: list[dict], python: Path | None = None, timeout_s: float = 600.0,
              pythonpath: str | None = None) -> list[dict]:
    """Runs the jobs in one interpreter (importing sglang costs ~20 s on a small CPU); returns their results.
    `pythonpath` puts an unpacked older release ahead of the venv's own sglang (`sglang_sources`)."""
    python = python or sglang_python()
    if python is None:
        raise FileNotFoundError("no sglang venv: run scripts/setup-sglang.sh (or set DRAFTLAB_SGLANG_PYTHON)")
    with tempfile.TemporaryDirectory() as tmp:
        jobs_path = Path(tmp) / "jobs.json"
        jobs_path.write_text(json.dumps(jobs))
        env = dict(os.environ, PYTHONWARNINGS="ignore", SGLANG_LOGGING_LEVEL="warning")
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
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
