"""The user's currency: which metric the verdict decides on, and what a unit of loss is worth in it.

The user pays for a draft in acceptance, so the verdict decides on tau: deployed tau (`bench/tau`) when every
baseline run benched, else the tau training predicts (`val/predicted_tau`). Loss is evidence beside it, judged
against a line in loss units derived from the sweep's own exchange rate: the slope of tau against loss over
the per-size means of the data-scaling series' `RATE_SIZES` largest sizes (least squares), where the next
doublings are read (tau is not linear in loss over a whole sweep: a unit of loss buys less tau at small sizes).
With a rate r tau per unit loss, the loss line is `material_tau / |r|`, so "clears the loss line" and "clears
the tau line" mean the same amount of acceptance.
A fixed share of the loss (`Thresholds.material_loss_rel`) is used only when the sweep has no tau at all, or
when loss and tau do not move together (a rate that is not negative, or fewer than `RATE_SIZES` sizes).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from draftlab.analysis.records import PREDICTED_TAU_KEY, TAU_KEY, Run, by_group, values

RATE_SIZES = 3  # per-size means the rate is read from: two points give a slope with no check of the line


def primary_metric(base_runs: list[Run], loss_key: str) -> str:
    """bench/tau when every baseline run has it, else val/predicted_tau when any has it, else the loss."""
    if base_runs and all(math.isfinite(r.value(TAU_KEY)) for r in base_runs):
        return TAU_KEY
    if any(math.isfinite(r.value(PREDICTED_TAU_KEY)) for r in base_runs):
        return PREDICTED_TAU_KEY
    return loss_key


def tau_per_loss(series: list[Run], loss_key: str, tau_key: str) -> float:
    """Tau per unit of loss over the largest sizes of the data-scaling series (negative: lower loss, higher
    tau); NaN with fewer than `RATE_SIZES` sizes holding both."""
    pts = [(values(g, loss_key), values(g, tau_key)) for _, g in by_group(series)]
    pts = [(lo.mean(), ta.mean()) for lo, ta in pts if lo.size and ta.size][-RATE_SIZES:]
    if len(pts) < RATE_SIZES:
        return math.nan
    x, y = np.array(pts).T
    if np.ptp(x) == 0:
        return math.nan
    return float(np.polyfit(x, y, 1)[0])


def with_loss_line(th, rate: float):
    """Thresholds whose loss line is worth `material_tau` at this rate; unchanged when the rate says nothing."""
    if not (math.isfinite(rate) and rate < 0):
        return th
    return dataclasses.replace(th, material_loss_abs=th.material_tau / abs(rate))


def describe(rate: float, th) -> str:
    """One sentence on the exchange rate and the loss line it gives (or why the fixed share is used)."""
    if math.isfinite(th.material_loss_abs):
        return (f"At this sweep's exchange rate one unit of loss is worth {abs(rate):.3g} tau, so the loss line is "
                f"{th.material_loss_abs:.3g} (= {th.material_tau} tau).")
    why = "the sweep has no tau" if not math.isfinite(rate) else "tau does not rise as loss falls here"
    return f"The loss line is {th.material_loss_rel:.0%} of the loss ({why})."
