"""Comparisons at equal data: which factor settings (layers, draft size, epochs, ...) beat the baseline, the
train/validation gap. (Whether training converged is the steps axis: see axes.py.)

A comparison for factor k uses only runs whose config equals the baseline's except for k, at the largest data
size where two or more settings of k exist, so nothing else differs. Differences use the pooled seed sigma
(see stats.py) with a Student-t interval; with no replicates anywhere the interval is unknown and the
comparison cannot count as evidence. Where the runs hold per-sample validation results, the half-width of the
paired validation-sample bootstrap of the difference (valnoise.py) is added to it in quadrature.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from draftlab.analysis.records import Run, by_group, differs_only_in, direction, values
from draftlab.analysis.stats import NAN, Estimate, mean_diff, t_quantile
from draftlab.analysis.valnoise import ValNoise

CATEGORIES = {"extract.": "features", "draft.": "capacity", "train.": "optimisation"}


def category_of(key: str) -> str:
    return next((c for prefix, c in CATEGORIES.items() if key.startswith(prefix)), "other")


@dataclass
class Level:
    label: str
    mean: float
    sd: float
    count: int
    baseline: bool


@dataclass
class Comparison:
    key: str
    category: str
    metric: str
    n: float  # the data size the settings are compared at
    levels: list[Level]
    best: str
    worst: str
    best_vs_baseline: Estimate  # improvement of the best setting over the baseline (> 0 = better)
    best_vs_worst: Estimate  # improvement of the best setting over the worst

    @property
    def baseline(self) -> str:
        return next(lv.label for lv in self.levels if lv.baseline)


@dataclass
class Contrast:
    comparison: Comparison
    better: str  # the setting whose improvement is measured
    over: str  # the setting it is measured over
    as_trained: Estimate
    equal_steps: Estimate | None = None
    equal_seconds: Estimate | None = None
    unresolved: str = ""  # why no finding can be called, '' when one can

    @property
    def basis(self) -> str:
        if self.equal_seconds is not None:
            return "equal GPU-seconds"
        return "equal steps" if self.equal_steps is not None else "as trained"

    @property
    def used(self) -> Estimate:
        """The estimate the verdict reads: equal GPU-seconds, else equal steps, else as trained."""
        return self.equal_seconds or self.equal_steps or self.as_trained


def as_trained(c: Comparison) -> Contrast | None:
    """The comparison's contrast with no cost equalised: best over worst for features, best over the baseline
    otherwise; None when that is a setting against itself."""
    better, over, raw = ((c.best, c.worst, c.best_vs_worst) if c.category == "features"
                         else (c.best, c.baseline, c.best_vs_baseline))
    return None if better == over else Contrast(c, better, over, raw)


def _factor_keys(runs: list[Run]) -> list[str]:
    seen: dict[str, set] = defaultdict(set)
    for r in runs:
        for k, v in r.config:
            seen[k].add(v)
    return sorted(k for k, vs in seen.items() if len(vs) > 1)


def _with_val_noise(d: Estimate, a: list[Run], b: list[Run], vnoise: ValNoise | None, level: float) -> Estimate:
    """The seed interval of mean(a) - mean(b) widened by the validation-sample bootstrap of that difference."""
    if not d.known or vnoise is None or not vnoise.shifts:
        return d
    n_boot = min(len(v) for v in vnoise.shifts.values())
    diff = vnoise.group_shift(a, n_boot) - vnoise.group_shift(b, n_boot)
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(diff, [tail, 100.0 - tail])
    half = math.hypot((d.hi - d.lo) / 2.0, (hi - lo) / 2.0)
    return Estimate(d.value, d.value - half, d.value + half)


def compare_factor(runs: list[Run], baseline: tuple, key: str, metric: str, sigma: float, df: int,
                   level: float, vnoise: ValNoise | None = None) -> Comparison | None:
    """Settings of `key` at equal data, everything else at the baseline; None if not comparable."""
    base_value = dict(baseline).get(key, "None")
    # steps probes trained past their plateau: not the recipe the settings are compared under
    pool = [r for r in runs if differs_only_in(r.config, baseline, key) and math.isfinite(r.value(metric))
            and not r.probe]
    for n, group in reversed(by_group(pool)):
        cells: dict[str, list[Run]] = defaultdict(list)
        for r in group:
            cells[dict(r.config).get(key, "None")].append(r)
        if len(cells) < 2 or base_value not in cells:
            continue
        sign = direction(metric)
        levels = [Level(v, float(np.mean(values(c, metric))), float(np.std(values(c, metric), ddof=1))
                        if len(c) > 1 else NAN, len(c), v == base_value) for v, c in sorted(cells.items())]
        ranked = sorted(levels, key=lambda lv: sign * lv.mean, reverse=True)
        best, worst = ranked[0].label, ranked[-1].label

        def improvement(a: str, b: str) -> Estimate:
            if a == b:  # a setting against itself is 0 exactly, not the spread of two resamplings of one group
                return Estimate(0.0, 0.0, 0.0)
            d = mean_diff(values(cells[a], metric), values(cells[b], metric), sigma, df, level)
            d = _with_val_noise(d, cells[a], cells[b], vnoise, level)
            if sign > 0:
                return d
            return Estimate(0.0 - d.value, 0.0 - d.hi, 0.0 - d.lo) if d.known else Estimate(0.0 - d.value)

        return Comparison(key, category_of(key), metric, n, levels, best, worst,
                          improvement(best, base_value), improvement(best, worst))
    return None


def compare_all(runs: list[Run], baseline: tuple, metrics: list[str], noise: dict[str, tuple[float, int]],
                level: float, vnoise: dict[str, ValNoise] | None = None) -> list[Comparison]:
    out = []
    for key in _factor_keys(runs):
        for metric in metrics:
            sigma, df = noise.get(metric, (NAN, 0))
            c = compare_factor(runs, baseline, key, metric, sigma, df, level, (vnoise or {}).get(metric))
            if c is not None:
                out.append(c)
    return out


def train_val_gap(runs_at_nmax: list[Run], val_key: str, level: float) -> Estimate | None:
    """val loss - train loss at the largest N (> 0: the draft fits its training data better than new data).

    The interval uses the spread of the per-run gaps across seeds, which is what matters (paired per run).
    """
    gaps = np.array([r.value(val_key) - r.value("train/loss") for r in runs_at_nmax])
    gaps = gaps[np.isfinite(gaps)]
    if gaps.size == 0:
        return None
    if gaps.size < 2:
        return Estimate(float(gaps.mean()))
    half = t_quantile(level, gaps.size - 1) * gaps.std(ddof=1) / math.sqrt(gaps.size)
    return Estimate(float(gaps.mean()), float(gaps.mean() - half), float(gaps.mean() + half))
