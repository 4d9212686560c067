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
import sys
import tempfile
from pathlib import Path

PROBE = Path(__file__).with_name("contract_probe.py")
REPO = Path(__file__).resolve().parents[3]


def sglang_python() -> Path | None:
    explicit = os.environ.get("DRAFTLAB_SGLANG_PYTHON")
    candidate = Path(explicit) if explicit else REPO / ".venv-sglang" / "bin" / "python"
    return candidate if candidate.exists() else None


FIND_SGLANG = ("import importlib.metadata as m, importlib.util as u, json; s = u.find_spec('sglang'); "
               "print(json.dumps(s and [list(s.submodule_search_locations)[0], m.version('sglang')]))")


def find_sglang(python, env: dict | None = None, timeout_s: float = 120.0) -> tuple[Path, str] | None:
    """The package folder and version of the sglang `python` imports (with `env`), found without importing it;
    None when it has none. OSError / TimeoutExpired / CalledProcessError when the interpreter cannot run."""
    done = subprocess.run([str(python), "-c", FIND_SGLANG], capture_output=True, text=True, check=True,
                          timeout=timeout_s, env=env, stdin=subprocess.DEVNULL)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return None if found is None else (Path(found[0]), found[1])


def installed_sglang(python: Path) -> tuple[Path, str]:
    """The package folder and version of the sglang installed for `python`."""
    found = find_sglang(python)
    if found is None:
        raise FileNotFoundError(f"{python}: has no sglang installed")
    return found


def cli_python(prog: str, explicit: str | None) -> Path | None:
    """A contract command's sglang interpreter (--python, else the venv's); None, with a one-line refusal
    printed, when there is none."""
    python = Path(explicit) if explicit else sglang_python()
    if python is None or not python.is_file():
        print(f"{prog}: {python or 'no sglang venv'}: no such interpreter (run scripts/setup-sglang.sh or pass "
              "--python)", file=sys.stderr)
        return None
    return python


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
