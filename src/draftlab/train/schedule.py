"""The learning-rate schedule, the step budget and the plateau watch of early stopping: functions of the settings,
the trainer's JSON state and the data's batch count, so a resumed run recomputes exactly what an uninterrupted one
would.
Why warmup-stable-decay for early stopping: docs/ARCHITECTURE.md, "Training budget and convergence".
"""

from __future__ import annotations

import math
from typing import Any


from draftlab.config.config_schema import TrainConfig

MIN_SLOPE_PASSES = 4  # a slope interval from fewer validation passes has df < 2: too wide to read


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


def slope_window(s: TrainConfig) -> int:
    """Validation passes the slope is read over: twice the look-ahead (`early_stop_patience`) and one, so that
    pass-to-pass noise of the size of a pass's gain still leaves a slope to read."""
    return max(2 * (s.early_stop_patience or 0) + 1, MIN_SLOPE_PASSES)


def recent_slope(passes: list[list[float]], level: float) -> list[float] | None:
    """[slope, lo, hi] of val/loss per 1000 optimizer steps over (step, loss) passes, a Student-t interval at
    `level` (scipy.stats.linregress); None with fewer than 3 passes."""
    if len(passes) < 3:
        return None
    steps, losses = zip(*passes)
    from scipy import stats  # the slope test alone needs it: the training loop imports this module

    fit = stats.linregress(steps, losses)
    half = float(stats.t.ppf(0.5 + level / 2.0, len(passes) - 2)) * fit.stderr
    return [1000.0 * fit.slope, 1000.0 * (fit.slope - half), 1000.0 * (fit.slope + half)]


def _plateaued(watch: dict, score: float, s: TrainConfig) -> bool:
    """The plateau test. slope: the last `slope_window(s)` passes' val/loss slope, at the
    optimistic end of its interval, would gain less than `early_stop_min_delta` of the loss over the next
    `early_stop_patience` passes: early stopping fires when even the hopeful reading of the curve says little is
    left, and a noisy curve keeps training. delta: `early_stop_patience` passes without an improvement of
    `early_stop_min_delta` over the reference."""
    if s.plateau_test == "delta":
        if watch["ref"] is None or score < watch["ref"] * (1.0 - s.early_stop_min_delta):
            watch.update(ref=score, bad=0)
        else:
            watch["bad"] += 1
        return watch["bad"] >= s.early_stop_patience
    window = slope_window(s)
    watch["passes"] = (watch.get("passes") or [])[-(window - 1):] + [[float(watch["step"]), float(score)]]
    watch["slope"] = recent_slope(watch["passes"], s.early_stop_level)
    if len(watch["passes"]) < window or watch["slope"] is None:
        return False
    spacing = (watch["passes"][-1][0] - watch["passes"][0][0]) / (window - 1)
    left = -watch["slope"][1] / 1000.0 * spacing * s.early_stop_patience  # at the interval's optimistic end
    return left < s.early_stop_min_delta * abs(score)


def watch_plateau(state: dict[str, Any], score: float, s: TrainConfig) -> int | None:
    """Watches for the plateau (`_plateaued`). Updates `state` in place and returns the new stop step when the
    plateau fires now, else None. The slope at the plateau is kept (`final_slope`).

    wsd: the plateau starts the decay, `decay_ratio` x the steps so far, capped by the budget; a plateau inside
    the budget's own decay changes nothing. With `extend_steps` (the steps probe) the learning rate stays
    constant that many steps past the plateau before the decay starts, past the budget if need be: the probe
    measures what steps beyond the plateau still buy. Other schedules stop at the plateau (plus extend_steps).
    """
    watch = state["plateau"] or {"ref": None, "bad": 0}
    watch["step"] = state["step"]
    fired = _plateaued(watch, score, s)
    state["plateau"] = watch
    if not fired or state["stopped_early"]:
        return None
    step, budget, extend = state["step"], state["total_steps"], int(s.extend_steps or 0)
    if s.schedule != "wsd":
        state.update(stop_at=step + extend, stopped_early=True, plateau_step=step, final_slope=watch.get("slope"))
        return state["stop_at"]
    if state["decay_start"] is not None or step >= wsd_decay_start(budget, s.decay_ratio):
        return None
    start = step + extend
    decay = max(1, round(s.decay_ratio * start))
    state.update(decay_start=start, stop_at=start + decay if extend else min(budget, start + decay),
                 stopped_early=True, plateau_step=step, final_slope=watch.get("slope"))
    return state["stop_at"]


def slope_metrics(state: dict[str, Any], s: TrainConfig) -> dict[str, float]:
    """`train/final_slope` (+ _lo, _hi): val/loss per 1000 steps when the run stopped: at the plateau when early
    stopping fired, else over its last passes. NaN-free: absent with fewer than 3 validation passes."""
    slope = state.get("final_slope")
    if slope is None:
        passes = [[h["step"], h["val/loss"]] for h in state["history"] if "val/loss" in h]
        slope = recent_slope(passes[-slope_window(s):], s.early_stop_level)
    out = dict(zip(("train/final_slope", "train/final_slope_lo", "train/final_slope_hi"), slope or ()))
    if state.get("plateau_step") is not None:
        out["train/plateau_step"] = float(state["plateau_step"])
    return {k: float(v) for k, v in out.items() if math.isfinite(v)}
