"""MLflow run names that say what varies, e.g. `samples=6400 epochs=16`, instead of `likeable-vole-18`.

In a sweep, the varying keys are the sweep's own: the command line's sweep overrides (`train.lr=3e-4,1e-3`) and
the sweeper's `params` (the named experiments). The sweep callback writes them to the sweep folder
(`SWEEP_KEYS_FILE`), so that every job, whatever launcher runs it, names itself from its own values of those
keys. A single run is named after its command-line overrides. `tracking.run_name` always wins.
"""

from __future__ import annotations

import json
from pathlib import Path

SWEEP_KEYS_FILE = "sweep_keys.json"
# Overrides that say where, not what: they never name a run.
UNNAMED_PREFIXES = ("tracking.", "paths.", "hydra.", "hydra/")
MAX_NAME = 250


def _parse(overrides: list[str]):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides(list(overrides))


def sweep_keys(task_overrides: list[str], sweeper_params: dict | None) -> list[str]:
    """The keys a multirun varies, in command-line order, then the sweeper's own."""
    parsed = _parse(task_overrides)
    keys = [o.key_or_group for o in parsed if o.is_sweep_override()]
    fixed = {o.key_or_group for o in parsed if not o.is_sweep_override()}  # the command line pins these
    keys += [k for k in (sweeper_params or {}) if k not in keys and k not in fixed]
    return keys


def write_sweep_keys(sweep_dir: Path, keys: list[str]) -> None:
    from draftlab.util.fsutil import atomic_write_json

    atomic_write_json(Path(sweep_dir) / SWEEP_KEYS_FILE, keys)


def read_sweep_keys(sweep_dir: Path | None) -> list[str] | None:
    path = Path(sweep_dir) / SWEEP_KEYS_FILE if sweep_dir else None
    return json.loads(path.read_text()) if path is not None and path.exists() else None


def short_names(keys: list[str]) -> dict[str, str]:
    """`data.samples` -> `samples`, unless two keys would then read the same (`data.seed`, `train.seed`)."""
    last = [k.split(".")[-1].split("/")[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last)}


def run_name(job_overrides: list[str], varying: list[str] | None = None) -> str | None:
    """The name for a job run with `job_overrides` (Hydra's `overrides.task` of the job); `varying` = the
    sweep's keys, None for a single run (then every override but the where-settings names it)."""
    chosen = []
    for override in _parse(job_overrides):
        key = override.key_or_group
        if varying is not None and key not in varying:
            continue
        if varying is None and key.startswith(UNNAMED_PREFIXES):
            continue
        chosen.append((key, override.input_line.split("=", 1)[-1]))
    if not chosen:
        return None
    if varying is not None:  # sweep order, whatever order the launcher wrote the overrides in
        chosen.sort(key=lambda item: varying.index(item[0]))
    names = short_names([key for key, _ in chosen])
    return " ".join(f"{names[key]}={text}" for key, text in chosen)[:MAX_NAME]


def job_run_name(hydra_cfg, sweep_dir: Path | None) -> str | None:
    """The run name of the Hydra job described by `hydra_cfg` (HydraConfig.get())."""
    overrides = list(hydra_cfg.overrides.task)
    if sweep_dir is None:
        return run_name(overrides)
    varying = read_sweep_keys(sweep_dir)
    if varying is None:  # a sweep started without the callback: name it by everything it overrides
        return run_name(overrides)
    return run_name(overrides, varying)
