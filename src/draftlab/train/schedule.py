"""The learning-rate schedule, the step budget and the plateau watch of early stopping: functions of the settings,
the trainer's JSON state and the data's batch count, so a resumed run recomputes exactly what an uninterrupted one
would.
Why warmup-stable-decay for early stopping: docs/ARCHITECTURE.md, "Training budget and convergence".
"""

from __future__ import annotations

import math
from typing import Any

from draftlab.config import TrainConfig


def wsd_decay_start(total: int, decay_ratio: float) -> int:
    """Where warmup-stable-decay starts decaying when no plateau comes first: decay = decay_ratio x stable."""
    return min(total - 1, max(0, round(total / (1.0 + decay_ratio))))


def lr_factor(step: int, total: int, warmup_ratio: float, schedule: str, decay_start: int | None = None,
              end: int | None = None, decay_ratio: float = 0.2) -> float:
    """Multiplier of train.lr for optimizer step `step` (0-based) out of `total`: linear warmup, then decay.

    wsd: constant after warmup until `decay_start` (default `wsd_decay_start`), then linear to zero at `end`
    (default `total`); early stopping moves both (`watch_plateau`).
    """
    warmup = int(warmup_ratio * total)
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "wsd":
        end = total if end is None else end
        start = wsd_decay_start(total, decay_ratio) if decay_start is None else decay_start
        return 1.0 if step < start else max(0.0, (end - step) / max(1, end - start))
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def batches_per_epoch(source, s: TrainConfig) -> int:
    """The training split's batches per epoch, the unit of `budget_steps`: the source's count, or one pass over
    epoch 0 where it offers none (token-budget batching fixes the count per epoch)."""
    counter = getattr(source, "num_batches", None)
    if counter is not None:
        count = int(counter("train", 0, s.batch_tokens, s.max_seq_len, s.seed))
    else:
        count = sum(1 for _ in source.batches("train", 0, s.batch_tokens, s.max_seq_len, s.seed, True))
    if count <= 0:
        raise ValueError("train: the training split gives no batches (no samples, or every sample is longer "
                         "than train.max_seq_len)")
    return count


def budget_steps(epoch_batches: int, s: TrainConfig) -> int:
    """The run's step budget: train.max_steps when set, else train.epochs passes over the data."""
    if not s.max_steps and not s.epochs:
        raise ValueError("train.max_steps: no training budget; set train.max_steps or train.epochs")
    return int(s.max_steps) if s.max_steps else max(1, epoch_batches * s.epochs)


def watch_plateau(state: dict[str, Any], score: float, s: TrainConfig) -> int | None:
    """Counts validation passes since the last material improvement (below the reference by
    `early_stop_min_delta` of it); at `early_stop_patience` the stable phase ends. Updates `state` in place and
    returns the new stop step when the plateau fires now, else None.

    wsd: the plateau starts the decay, `decay_ratio` x the steps so far, capped by the budget; a plateau inside
    the budget's own decay changes nothing. Other schedules stop at the plateau.
    """
    watch = state["plateau"] or {"ref": None, "bad": 0}
    if watch["ref"] is None or score < watch["ref"] * (1.0 - s.early_stop_min_delta):
        watch = {"ref": score, "bad": 0}
    else:
        watch["bad"] += 1
    state["plateau"] = watch
    if watch["bad"] < s.early_stop_patience or state["stopped_early"]:
        return None
    step, budget = state["step"], state["total_steps"]
    if s.schedule != "wsd":
        state["stop_at"], state["stopped_early"] = step, True
        return step
    if state["decay_start"] is not None or step >= wsd_decay_start(budget, s.decay_ratio):
        return None
    state["decay_start"] = step
    state["stop_at"] = min(budget, step + max(1, round(s.decay_ratio * step)))
    state["stopped_early"] = True
    return state["stop_at"]
