"""What a run was made from: git commit, dirty flag, package versions, and content fingerprints."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any


def fingerprint(obj: Any) -> str:
    """sha256 of the canonical JSON of `obj` (dict key order does not matter)."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


@lru_cache(maxsize=64)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    stat = Path(path).stat()
    return _file_sha256(str(path), stat.st_size, stat.st_mtime_ns)


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip()


def git_state(cwd: Path) -> dict[str, str]:
    commit = _git(["rev-parse", "HEAD"], cwd)
    if commit is None:
        # a copy without .git, e.g. the `git archive` a GPU machine gets: its launcher names the commit. Whether
        # the copy was edited since cannot be known here, so dirty stays unknown.
        named = os.environ.get("DRAFTLAB_GIT_COMMIT", "").strip()
        return {"git.commit": named or "unknown", "git.dirty": "unknown"}
    status = _git(["status", "--porcelain", "--untracked-files=no"], cwd)
    return {"git.commit": commit, "git.dirty": str(bool(status)).lower()}


def package_versions(names=("torch", "transformers", "mlflow", "hydra-core", "dvc", "safetensors")) -> dict[str, str]:
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions
