"""The four stages and the one place that runs a stage: `invoke()`, used by `src/run.py`'s pipeline and by
`python -m draftlab stage` under DVC alike (dispatch, timing, the metrics file, the reporter's summary).

Stage modules are imported plainly, but only when their stage runs: they import torch, and an all-cached run
must not pay for it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from draftlab.config.config import STAGE_NAMES
from draftlab.util.fsutil import atomic_write_json


def stage_function(name: str) -> Callable:
    if name == "generate":
        from draftlab.stages import generate as module
    elif name == "extract":
        from draftlab.stages import extract as module
    elif name == "train":
        from draftlab.stages import train as module
    elif name == "bench":
        from draftlab.stages import bench as module
    else:
        raise ValueError(f"unknown stage {name!r} (known: {', '.join(STAGE_NAMES)})")
    return module.run


def invoke(name: str, cfg, out: Path, inputs: dict[str, Path], reporter,
           metrics_files: tuple[Path, ...] = ()) -> dict[str, float]:
    """Runs stage `name` into `out`; returns its metrics with `<name>/seconds` and `<name>/cached` added,
    after writing them to each of `metrics_files` and to the reporter (at the stage's last step)."""
    run = stage_function(name)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    metrics = dict(run(cfg, out, inputs, reporter))
    metrics[f"{name}/seconds"] = time.perf_counter() - started
    # An incremental stage that found every sample in its pool did no work: it counts as cached (online extract
    # reports 0 when it found its manifest and head, and leaves the metric out when it loaded the target).
    metrics[f"{name}/cached"] = float(metrics.get(f"{name}/new_samples", 1) == 0)
    for path in metrics_files:
        atomic_write_json(Path(path), metrics)
    reporter.metrics(metrics, step=final_step(metrics))
    return metrics


def final_step(metrics: dict) -> int:
    """A stage's summary lands at its last optimizer step, so it extends the curves instead of adding a
    point at step 0 to them."""
    return int(metrics.get("train/steps", 0))
