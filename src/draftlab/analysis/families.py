"""A second curve family beside the power law, the spread between them, and when a ceiling may be stated.

Why two families: a power law with a floor and a quadratic in log N can fit the same 4-6 points within the
noise and still disagree about what lies beyond them (SmolLM2's four sizes: a floor at tau 3.50 against a
peak near 3.08). Where they disagree, the data do not decide, and the report says so instead of picking one.

Log-quadratic: y(N) = a + b u + c u^2 with u = log2(N / N_max), fitted by weighted least squares
(scipy.linalg.lstsq), its intervals by the same parametric bootstrap as the power law's (fit.py). Its ceiling
is the extremum in the improving direction (a floor for a loss, a peak for tau); with the other curvature it
has none (infinite).

Rules (module constants): projections go at most `MAX_PROJECTION`x past the largest size; a ceiling is stated
only with `CEILING_MIN_SIZES` sizes spanning `CEILING_MIN_SPAN`x whose families' ceiling intervals overlap,
whose families' point ceilings lie within the material line of each other (intervals that overlap only because
they are wide do not make two readings one), and whose power law misfits the means by at most `MAX_MISFIT`x the
seed-to-seed sd (a curve that misses its own points by more says nothing past them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.linalg import lstsq

from draftlab.analysis.stats import NAN, Estimate, percentile_estimate

MAX_PROJECTION = 2.0
CEILING_MIN_SIZES = 5
CEILING_MIN_SPAN = 16.0
MAX_MISFIT = 3.0
NO_CEILING = "no ceiling can be read from these sizes"


@dataclass
class FamilyFit:
    name: str  # "power law" | "log-quadratic"
    gain: Estimate  # improvement N_max -> 2 N_max (> 0 = better)
    at_2x: Estimate  # the metric projected at 2 N_max
    ceiling: Estimate  # the asymptote / extremum in the improving direction (+-inf: none)
    fitted_nmax: Estimate = Estimate(NAN)
    band: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None  # grid N, mid, lo, hi


def noise_draws(fitted: np.ndarray, counts: np.ndarray, sigma: float, df: int, shifts: np.ndarray | None,
                n_boot: int, seed: int) -> np.ndarray | None:
    """[n_boot, k] redraws of the per-N means: seed noise (sigma from sigma^2 df / chi2(df), over sqrt(runs))
    plus the validation-sample shifts [n_boot, k] when given; None without any noise estimate."""
    have_sigma = math.isfinite(sigma) and df > 0
    if n_boot <= 0 or not (have_sigma or shifts is not None):
        return None
    rng = np.random.default_rng(seed)
    ys = np.repeat(fitted[None, :], n_boot, axis=0)
    if have_sigma:
        sigmas = sigma * np.sqrt(df / rng.chisquare(df, size=n_boot))
        ys = ys + rng.standard_normal((n_boot, fitted.size)) * (sigmas[:, None] / np.sqrt(counts))
    if shifts is not None:
        ys = ys + shifts[:n_boot]
    return ys


def _design(u: np.ndarray) -> np.ndarray:
    return np.stack([np.ones_like(u), u, u**2], axis=1)


def _lq_fit(u: np.ndarray, ys: np.ndarray, w: np.ndarray) -> np.ndarray:
    """ys [B, k] -> coefficients [B, 3] of a + b u + c u^2 by weighted least squares."""
    sw = np.sqrt(w)
    coef, *_ = lstsq(_design(u) * sw[:, None], (ys * sw[None, :]).T)
    return coef.T


def _extremum(coef: np.ndarray, sign: int) -> np.ndarray:
    """The log-quadratic's ceiling (sign -1, a peak) or floor (sign +1): +-inf where it curves the other way."""
    a, b, c = coef.T
    turns = sign * c > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        value = a - b**2 / (4.0 * c)
    return np.where(turns, value, -sign * np.inf)


def infinite_aware(value: float, samples: np.ndarray, level: float) -> Estimate:
    """Percentile interval whose ends may be infinite (draws without a ceiling count as one at infinity)."""
    samples = np.asarray(samples, dtype=float)
    samples = samples[~np.isnan(samples)]
    if samples.size < 10:
        return Estimate(value)
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(samples, [tail, 100.0 - tail], method="nearest")
    return Estimate(value, float(lo), float(hi))


def log_quadratic(n, mean, counts, sign, sigma, df, shifts, level, n_boot, seed) -> FamilyFit | None:
    """The log-quadratic family on per-N means; None with fewer than 4 sizes (it has 3 parameters)."""
    if len(n) < 4:
        return None
    u = np.log2(n / n[-1])
    coef = _lq_fit(u, mean[None, :], counts)[0]
    fitted = _design(u) @ coef
    grid = np.geomspace(n[0], MAX_PROJECTION * n[-1], 60)
    gu = np.log2(grid / n[-1])

    def derived(cf):
        return {"gain": -sign * (cf[:, 1] + cf[:, 2]), "2x": cf.sum(axis=1), "nmax": cf[:, 0],
                "ceiling": _extremum(cf, sign)}

    point = {k: float(v[0]) for k, v in derived(coef[None, :]).items()}
    curve = _design(gu) @ coef
    resid_df = len(n) - 3
    if resid_df > 0:  # lack of fit widens this family's intervals, as in the power law's (fit.py)
        resid = math.sqrt(float((counts * (fitted - mean) ** 2).sum()) / resid_df)
        if not (df > 0 and math.isfinite(sigma) and sigma >= resid):
            sigma, df = resid, resid_df
    ys = noise_draws(fitted, counts, sigma, df, shifts, n_boot, seed)
    if ys is None:
        return FamilyFit("log-quadratic", Estimate(point["gain"]), Estimate(point["2x"]), Estimate(point["ceiling"]),
                         Estimate(point["nmax"]), (grid, curve, curve, curve))
    boot = _lq_fit(u, ys, counts)
    d = derived(boot)
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(_design(gu) @ boot.T, [tail, 100.0 - tail], axis=1)
    return FamilyFit("log-quadratic", percentile_estimate(point["gain"], d["gain"], level),
                     percentile_estimate(point["2x"], d["2x"], level),
                     infinite_aware(point["ceiling"], d["ceiling"], level),
                     percentile_estimate(point["nmax"], d["nmax"], level), (grid, curve, lo, hi))


def spread(families: list[FamilyFit], what: str) -> float:
    """The largest difference between the families' point values of `what` (gain | at_2x); NaN with one."""
    values = [getattr(f, what).value for f in families if math.isfinite(getattr(f, what).value)]
    return max(values) - min(values) if len(values) >= 2 else NAN


def _overlap(a: Estimate, b: Estimate) -> bool:
    return a.known and b.known and a.lo <= b.hi and b.lo <= a.hi


def ceiling(n: np.ndarray, families: list[FamilyFit], material: float = NAN,
            misfit: float = NAN) -> tuple[Estimate | None, str]:
    """(the ceiling, why) under the rule in the module docstring; None with the reason when it cannot be read.
    `material`: the line the point ceilings must agree within; `misfit`: the fit's residual sd / the seed sd."""
    span = float(n[-1] / n[0]) if len(n) else NAN
    if len(n) < CEILING_MIN_SIZES or not span >= CEILING_MIN_SPAN:
        return None, (f"{NO_CEILING} ({len(n)} sizes spanning {span:.3g}x; a ceiling needs at least "
                      f"{CEILING_MIN_SIZES} sizes spanning {CEILING_MIN_SPAN:.0f}x)")
    if len(families) < 2:
        return None, f"{NO_CEILING} (only one curve family could be fitted)"
    ests = [f.ceiling for f in families]
    if not all(e.known and math.isfinite(e.value) and math.isfinite(e.lo) and math.isfinite(e.hi) for e in ests):
        none = ", ".join(f.name for f, e in zip(families, ests) if not (e.known and np.isfinite([e.lo, e.hi]).all()))
        return None, f"{NO_CEILING} (the {none} has no finite ceiling within its interval)"
    if not all(_overlap(a, b) for i, a in enumerate(ests) for b in ests[i + 1:]):
        said = "; ".join(f"{f.name} {e.fmt()}" for f, e in zip(families, ests))
        return None, f"{NO_CEILING} (the curve families disagree: {said})"
    points = [e.value for e in ests]
    if math.isfinite(material) and max(points) - min(points) > material:
        said = "; ".join(f"{f.name} {e.value:.3g}" for f, e in zip(families, ests))
        return None, (f"{NO_CEILING} (the curve families' ceilings are {max(points) - min(points):.3g} apart, "
                      f"more than the material line {material:.3g}: {said})")
    if math.isfinite(misfit) and misfit > MAX_MISFIT:
        return None, (f"{NO_CEILING} (the power law misses the means by {misfit:.3g}x the seed-to-seed noise, "
                      f"more than {MAX_MISFIT:.0f}x)")
    lo, hi = min(e.lo for e in ests), max(e.hi for e in ests)
    return Estimate(float(np.mean([e.value for e in ests])), lo, hi), (
        "the curve families agree: " + "; ".join(f"{f.name} {e.fmt()}" for f, e in zip(families, ests)))
