"""The train stage read window by window, the same way for any commit's code: runs CODE's `src/run.py` in this
process with tracking off, every metrics call its RecordingReporter gets timed, and prints one JSON line of rates.
`train_stage_gpu` runs it on this checkout and on the reference (5c67ce0), whose stage logs no per-window times.

    python benchmarks/stage_windows.py --code DIR [--log windows.jsonl] -- OVERRIDE...

A window's seconds run from the report before it to its own; its tokens are its rate times them. Readings:
`late` (the deciding one): windows in the last third of the steps, none right after a validation pass (its
seconds hold the pass); `steady`: the same over every step; `last_window`: the last window's rate.
"""

from __future__ import annotations

import argparse
import importlib
import json
import runpy
import sys
import time
from pathlib import Path


def patch_reporter(code: Path, records: list[dict]) -> None:
    """Every metrics call of CODE's RecordingReporter appended to `records` with its wall clock."""
    sys.path.insert(0, str(code / "src"))
    for name in ("draftlab.util.reporting", "draftlab.reporting"):  # this checkout's module, then 5c67ce0's
        try:
            reporting = importlib.import_module(name)
            break
        except ImportError:
            continue
    else:
        raise SystemExit(f"no RecordingReporter under {code / 'src'}")
    original = reporting.RecordingReporter.metrics

    def metrics(self, values, step=None):
        numbers = {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        records.append({"t": time.time(), "step": step, **numbers})
        return original(self, values, step)

    reporting.RecordingReporter.metrics = metrics


def windows(records: list[dict]) -> list[dict]:
    found, gap, before = [], True, None
    for record in records:
        if "val/loss" in record and "train/tokens_per_s" not in record:
            gap = True
        elif "train/tokens_per_s" in record and "train/seconds" not in record:  # not the stage's closing metrics
            seconds = record["t"] - before if before is not None else 0.0
            found.append({"step": record["step"] or 0, "seconds": seconds, "after_gap": gap,
                          "tokens": record["train/tokens_per_s"] * seconds, "tokens_per_s": record["train/tokens_per_s"]})
            gap = False
        before = record["t"]
    return found


def readings(records: list[dict]) -> dict:
    found = windows(records)
    if not found:
        raise SystemExit("no train log windows were reported")
    steady = [w for w in found if not w["after_gap"] and w["seconds"] > 0]
    late = [w for w in steady if w["step"] >= max(w["step"] for w in found) * 2 / 3]

    def rate(chosen):
        return sum(w["tokens"] for w in chosen) / sum(w["seconds"] for w in chosen) if chosen else None

    return {"windows": len(found), "late": rate(late), "steady": rate(steady), "last_window": found[-1]["tokens_per_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", type=Path, required=True, help="the checkout whose src/run.py runs")
    ap.add_argument("--log", type=Path, help="also write every timed metrics call here as JSON lines")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    records: list[dict] = []
    patch_reporter(args.code.resolve(), records)
    script = args.code.resolve() / "src" / "run.py"
    sys.argv = [str(script), "tracking.enabled=false", *args.overrides]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as done:  # Hydra's main may exit; its code decides
        if done.code:
            raise
    if args.log:
        args.log.write_text("".join(json.dumps(r) + "\n" for r in records))
    print(json.dumps(readings(records)))


if __name__ == "__main__":
    main()
