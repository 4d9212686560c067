"""Deployed tau during training beside val/loss: whether tau peaked before the loss did, and the figure.

The benches of `train.bench_every` (train/bench_tau.py) give `train/bench_tau` at their steps; the validation
passes give val/loss at theirs. A draft whose tau peaks while val/loss still falls is one that early stopping on
loss trains past its best deployed point, so the train stage records:
  - `train/bench_tau_peak` and `train/bench_tau_peak_step`: the highest bench and its step (the first, on ties);
  - `train/val_loss_min_step`: the step of the lowest val/loss;
  - `train/tau_peaked_first`: 1 when the tau peak came at an earlier step than the loss minimum, else 0;
  - `train/bench_tau_after_peak`: the last bench's tau over the peak's, minus 1 (0: no drop after the peak).
"""

from __future__ import annotations

import logging
from pathlib import Path

from draftlab.util import fsutil

log = logging.getLogger("draftlab")


def tau_during_training(history: list[dict], bench: list[dict]) -> dict[str, float]:
    """The metrics of the module docstring; {} without benches."""
    points = [(b["step"], b["train/bench_tau"]) for b in bench if "train/bench_tau" in b]
    if not points:
        return {}
    peak_step, peak = max(points, key=lambda p: (p[1], -p[0]))
    out = {"train/bench_tau_peak": float(peak), "train/bench_tau_peak_step": float(peak_step),
           "train/bench_tau_after_peak": float(points[-1][1] / peak - 1.0) if peak else 0.0}
    losses = [(h["step"], h["val/loss"]) for h in history if "val/loss" in h]
    if losses:
        loss_step = min(losses, key=lambda p: (p[1], p[0]))[0]
        out["train/val_loss_min_step"] = float(loss_step)
        out["train/tau_peaked_first"] = float(peak_step < loss_step)
        log.info("train: deployed tau peaked at step %d (%.3f)%s the val/loss minimum at step %d; the last bench "
                 "is %+.1f%% of the peak", peak_step, peak, ", before" if peak_step < loss_step else ", not before",
                 loss_step, 100 * out["train/bench_tau_after_peak"])
    return out


def plot_tau_during_training(history: list[dict], bench: list[dict], path: Path) -> Path:
    """val/loss (left axis) and train/bench_tau (right axis) against optimizer steps, each extreme marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    losses = [(h["step"], h["val/loss"]) for h in history if "val/loss" in h]
    if losses:
        ax.plot(*zip(*losses), "o-", color="C0", ms=3, label="val/loss")
        step, value = min(losses, key=lambda p: (p[1], p[0]))
        ax.axvline(step, color="C0", ls=":", lw=1)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("val/loss", color="C0")
    right = ax.twinx()
    taus = [(b["step"], b["train/bench_tau"]) for b in bench if "train/bench_tau" in b]
    right.plot(*zip(*taus), "s-", color="C3", ms=4, label="train/bench_tau")
    step, value = max(taus, key=lambda p: (p[1], -p[0]))
    right.axvline(step, color="C3", ls=":", lw=1)
    right.set_ylabel("deployed tau (train/bench_tau)", color="C3")
    ax.set_title("deployed tau beside val/loss (dotted: tau's peak, loss's minimum)")
    fig.tight_layout()
    with fsutil.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return path
