"""The plateau test of early stopping: the recent val/loss slope's interval, not a fixed gain per pass; and the
slope every run records when it stops."""

from __future__ import annotations

import numpy as np
import pytest

from draftlab.config.config_schema import TrainConfig
from draftlab.train.schedule import recent_slope, slope_metrics, watch_plateau


def _state(total=100_000):
    return {"step": 0, "total_steps": total, "plateau": None, "stopped_early": False, "decay_start": None,
            "stop_at": total, "history": []}


def _feed(losses, spacing=100, **kw):
    """Validation passes every `spacing` steps; returns (the pass whose plateau fired or None, the state)."""
    s = TrainConfig(early_stop_patience=4, early_stop_min_delta=0.005, max_steps=100_000, decay_ratio=0.2, **kw)
    state = _state()
    for i, loss in enumerate(losses, 1):
        state["step"] = i * spacing
        state["history"].append({"step": float(state["step"]), "val/loss": float(loss)})
        if watch_plateau(state, float(loss), s) is not None:
            return i, state
    return None, state


def test_recent_slope_of_a_line_is_exact():
    slope, lo, hi = recent_slope([[100, 9.0], [200, 8.9], [300, 8.8], [400, 8.7]], 0.9)
    assert slope == pytest.approx(-1.0) and lo == pytest.approx(-1.0) and hi == pytest.approx(-1.0)


def still_falling(seed=0):
    """The two-layer run's curve: val/loss falling 0.18 per 1000 steps around 8.3, passes 0.03 apart in noise."""
    rng = np.random.default_rng(seed)
    return [8.6 - 0.018 * i + rng.normal(0, 0.03) for i in range(30)]


def test_a_curve_still_falling_is_not_a_plateau_for_the_slope_test():
    fired_delta, _ = _feed(still_falling(), plateau_test="delta")
    fired_slope, state = _feed(still_falling(), plateau_test="slope")
    assert fired_delta is not None  # the old test stops it: 4 passes without a 0.5% gain
    assert fired_slope is None, state["plateau"]["slope"]  # the slope says 0.07 may be left in 4 passes


def test_a_flat_curve_plateaus_and_keeps_its_slope():
    rng = np.random.default_rng(1)
    fired, state = _feed([8.0 + rng.normal(0, 0.002) for _ in range(20)])
    assert fired == 9 and state["plateau_step"] == 900 and state["decay_start"] == 900  # 9 passes: 2 x 4 + 1
    metrics = slope_metrics(state, TrainConfig(early_stop_patience=4))
    lo, hi = metrics["train/final_slope_lo"], metrics["train/final_slope_hi"]
    assert lo < metrics["train/final_slope"] < hi and abs(metrics["train/final_slope"]) < 0.1
    assert metrics["train/plateau_step"] == 900.0


def test_the_probe_holds_the_lr_past_the_plateau_and_past_the_budget():
    rng = np.random.default_rng(1)
    s = TrainConfig(early_stop_patience=4, max_steps=2000, decay_ratio=0.2, extend_steps=2000)
    state = _state(total=2000)
    for i in range(1, 11):
        state["step"] = i * 100
        if watch_plateau(state, 8.0 + rng.normal(0, 0.002), s) is not None:
            break
    assert state["plateau_step"] == 900 and state["decay_start"] == 2900 and state["stop_at"] == 2900 + 580


def test_a_run_that_never_plateaued_records_its_last_slope():
    state = _state()
    state["history"] = [{"step": float(100 * i), "val/loss": 9.0 - 0.1 * i} for i in range(1, 8)]
    metrics = slope_metrics(state, TrainConfig(early_stop_patience=4))
    assert metrics["train/final_slope"] == pytest.approx(-1.0) and "train/plateau_step" not in metrics
    assert slope_metrics(_state(), TrainConfig()) == {}  # no passes, no slope
