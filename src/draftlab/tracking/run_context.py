"""Where a job's runs live and what names a job, with no MLflow import: the repository root, the tracking URI,
a sweep's parent-run file, the config flattened to params, the job key and the identity of a process.
draftlab.tracking.runs (the only module that talks to MLflow) builds on these; so do the drivers that only need a
path or a name (src/run.py, the sweep callback, the pipeline).
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import OmegaConf

PARENT_ID_FILE = "mlflow_parent_run_id"


def repo_root(start: Path | None = None) -> Path:
    """The project folder (the one holding conf/). Inside a queued `dvc exp run` the work happens in a copy
    under .dvc/tmp/exps/; runs must still land in the real repository's store, so the copy is seen through."""
    here = Path(start or Path.cwd()).resolve()
    parts = here.parts
    if ".dvc" in parts:
        return Path(*parts[: parts.index(".dvc")])
    for folder in (here, *here.parents):
        if (folder / "conf" / "config.yaml").exists():
            return folder
    return here


def tracking_uri(configured: str | None = None) -> str:
    """`tracking.uri`, else MLFLOW_TRACKING_URI, else sqlite:///<repo>/mlruns/mlflow.db (absolute)."""
    if configured:
        return configured
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    store = repo_root() / "mlruns"  # the one store folder draftlab makes (draftlab.tracking.store refuses others)
    store.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{store / 'mlflow.db'}"


def flatten(cfg) -> dict[str, str]:
    container = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else cfg
    flat: dict[str, str] = {}

    def walk(node, prefix):
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            flat[prefix[:-1]] = str(node)[:6000]

    walk(container, "")
    return flat


def process_identity(pid: int) -> str | None:
    """pid plus the process's start time (Linux /proc), so that a reused pid is not mistaken for a live job."""
    try:
        return f"{pid}:{Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[19]}"
    except (OSError, IndexError):
        return None


def job_key(cfg) -> str:
    """What makes two jobs the same job: their whole resolved config."""
    from draftlab.provenance.provenance import fingerprint

    return fingerprint(flatten(cfg))[:16]


def parent_run_id_for(sweep_dir: Path | None) -> str | None:
    if sweep_dir is None:
        return None
    path = Path(sweep_dir) / PARENT_ID_FILE
    return path.read_text().strip() if path.exists() else None
