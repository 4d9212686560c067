"""Small statistics helpers shared by the fits and the comparisons: an estimate with an interval, pooled noise.

Noise model (documented once, used everywhere): run-to-run noise of a metric is taken to be the same for every
configuration and data size (homoscedastic), so replicate seeds anywhere in the sweep pool into one estimate of
sigma with more degrees of freedom than any single group would give.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np
from scipy import stats

NAN = float("nan")


@dataclass(frozen=True)
class Estimate:
    """A point value with a two-sided interval; lo/hi are NaN when the data cannot give one."""

    value: float
    lo: float = NAN
    hi: float = NAN

    @property
    def known(self) -> bool:
        return math.isfinite(self.lo) and math.isfinite(self.hi)

    def fmt(self, digits: int = 3) -> str:
        v = f"{self.value:.{digits}g}" if math.isfinite(self.value) else "n/a"
        if not self.known:
            return f"{v} [interval unknown]"
        return f"{v} [{self.lo:.{digits}g}, {self.hi:.{digits}g}]"

    def as_metrics(self, name: str) -> dict[str, float]:
        out = {name: self.value}
        if self.known:
            out[f"{name}_lo"], out[f"{name}_hi"] = self.lo, self.hi
        return {k: float(v) for k, v in out.items() if math.isfinite(v)}


def percentile_estimate(value: float, samples: np.ndarray, level: float) -> Estimate:
    """Percentile bootstrap interval; NaN samples (failed refits) are dropped, none left means unknown."""
    samples = np.asarray(samples, dtype=float)
    samples = samples[np.isfinite(samples)]
    if samples.size < 10:
        return Estimate(value)
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(samples, [tail, 100.0 - tail])
    return Estimate(value, float(lo), float(hi))


def pooled_sd(groups: Iterable[np.ndarray]) -> tuple[float, int]:
    """Pooled within-group standard deviation and its degrees of freedom (sum of n_i - 1); (NaN, 0) if none."""
    ss, df = 0.0, 0
    for g in groups:
        g = np.asarray(g, dtype=float)
        g = g[np.isfinite(g)]
        if g.size >= 2:
            ss += float(((g - g.mean()) ** 2).sum())
            df += g.size - 1
    return (math.sqrt(ss / df), df) if df > 0 else (NAN, 0)


def t_quantile(level: float, df: int) -> float:
    """Two-sided Student-t quantile; small df widens the interval, which is the point with few seeds."""
    return float(stats.t.ppf(0.5 + level / 2.0, df)) if df > 0 else NAN


def mean_diff(a: np.ndarray, b: np.ndarray, sigma: float, df: int, level: float) -> Estimate:
    """mean(a) - mean(b) with a t interval from the pooled sigma (NaN interval when sigma is unknown)."""
    value = float(np.mean(a) - np.mean(b))
    if not (math.isfinite(sigma) and df > 0):
        return Estimate(value)
    half = t_quantile(level, df) * sigma * math.sqrt(1.0 / len(a) + 1.0 / len(b))
    return Estimate(value, value - half, value + half)


def scaled(e: Estimate, factor: float) -> Estimate:
    """The estimate times a factor (a negative factor swaps the bounds)."""
    lo, hi = sorted((e.lo * factor, e.hi * factor)) if e.known else (NAN, NAN)
    return Estimate(e.value * factor, lo, hi)
