"""Power-law fits of a metric against data size, with a parametric residual bootstrap for the intervals.

Model, with x = N / N_max so that A is the part still reducible at the largest N tried:
    y(N) = y_inf + s * A * x^-alpha,   A >= 0, alpha in [0.05, 3]
s = +1 for a falling curve (loss: L_inf + A N^-alpha), s = -1 for a rising one (tau: tau_inf - A N^-alpha).
The gain per doubling at N_max is the improvement y(N_max) -> y(2 N_max) = A (1 - 2^-alpha), always >= 0.

Why a parametric bootstrap rather than resampling points: sweeps have 3-6 data sizes, and resampling 4 points
mostly yields degenerate fits. Instead each replicate redraws every per-N mean from the fitted curve plus
Gaussian noise of the estimated run-to-run sigma (divided by sqrt(seeds at that N)), and refits. Sigma is the
larger of the seed-to-seed sd (model-free, when seeds exist) and the fit's residual sd (catches lack of fit,
needs more N values than parameters). With few degrees of freedom sigma itself is uncertain, so each replicate
draws its own sigma from sigma^2 * df / chi2(df): the intervals then widen like Student-t ones, as they should.
Where the runs hold per-sample validation results, each replicate also adds the per-N shift of a paired
bootstrap over the validation samples (valnoise.py), so the intervals hold validation-sample noise too.

A log-quadratic is fitted beside it (families.py): the report gives both, their spread, and a ceiling only
when the rule there allows one. Nothing is projected past 2x the largest size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import least_squares

from draftlab.analysis.families import (MAX_PROJECTION, FamilyFit, ceiling, log_quadratic, noise_draws,
                                        spread)
from draftlab.analysis.stats import NAN, Estimate, percentile_estimate, t_quantile

ALPHA_BOUNDS = (0.05, 3.0)


@dataclass
class PowerLawFit:
    metric: str
    sign: int  # +1 falling curve (loss), -1 rising curve (tau)
    n: np.ndarray  # distinct data sizes, ascending
    mean: np.ndarray  # per-N mean of the metric
    counts: np.ndarray  # runs (seeds) per N
    ok: bool = False  # a power law was fitted (enough distinct N)
    params: dict[str, Estimate] = field(default_factory=dict)  # y_inf, A_at_nmax, alpha
    gain_per_doubling: Estimate = Estimate(NAN)  # improvement N_max -> 2 N_max (>= 0 = better)
    local_gain: Estimate = Estimate(NAN)  # model-free: improvement per doubling between the two largest N
    fitted_nmax: Estimate = Estimate(NAN)
    projections: dict[str, Estimate] = field(default_factory=dict)  # "2x" of N_max (never further)
    sigma: float = NAN
    sigma_df: int = 0
    sigma_source: str = "none"
    band: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None  # grid N, mid, lo, hi
    note: str = ""
    families: list[FamilyFit] = field(default_factory=list)  # power law first, then log-quadratic
    ceiling: Estimate | None = None  # only where families.ceiling's rule allows one
    ceiling_note: str = ""
    val_noise: bool = False  # the intervals include validation-sample noise
    misfit: float = NAN  # the fit's residual sd over the seed-to-seed sd (NaN without both)

    @property
    def gain_spread(self) -> float:
        """Difference between the families' gains per doubling at N_max (NaN with one family)."""
        return spread(self.families, "gain")

    @property
    def at_2x_spread(self) -> float:
        return spread(self.families, "at_2x")

    @property
    def n_max(self) -> float:
        return float(self.n[-1])


def _model(theta: np.ndarray, x: np.ndarray, sign: int) -> np.ndarray:
    y_inf, a, alpha = theta
    return y_inf + sign * a * x ** (-alpha)


ALPHA_GRID = np.geomspace(ALPHA_BOUNDS[0], ALPHA_BOUNDS[1], 1500)  # ~0.3% steps in alpha


def _profile_fit(x: np.ndarray, ys: np.ndarray, w: np.ndarray, sign: int, lower: float) -> np.ndarray:
    """Global fit of many curves at once: for each alpha on a fine grid the model is linear in (y_inf, A),
    solved in closed form under A >= 0 and y_inf >= lower; the best alpha wins. ys: [B, k] -> thetas [B, 3].

    Profiling over alpha finds the global minimum however badly alpha is identified, and vectorises the
    bootstrap (thousands of refits in milliseconds); the point fit is then polished by least_squares.
    """
    u = sign * x[None, :] ** (-ALPHA_GRID[:, None])  # [G, k]
    wn = w / w.sum()
    u_bar, y_bar = u @ wn, ys @ wn  # [G], [B]
    du, dy = u - u_bar[:, None], ys - y_bar[:, None]
    a = (du * wn) @ dy.T / np.maximum((du**2) @ wn, 1e-300)[:, None]  # [G, B]
    a = np.maximum(a, 0.0)
    c = y_bar[None, :] - a * u_bar[:, None]
    low = c < lower  # y_inf at its bound: refit A alone through the bound
    if low.any():
        a_low = np.maximum((u * wn) @ (ys - lower).T / np.maximum((u**2) @ wn, 1e-300)[:, None], 0.0)
        a, c = np.where(low, a_low, a), np.where(low, lower, c)
    resid = ys[None, :, :] - c[:, :, None] - a[:, :, None] * u[:, None, :]  # [G, B, k]
    best = np.argmin((resid**2) @ w, axis=0)  # [B]
    cols = np.arange(ys.shape[0])
    return np.stack([c[best, cols], a[best, cols], ALPHA_GRID[best]], axis=1)


def _fit(x, y, w, sign, lower) -> np.ndarray:
    theta0 = _profile_fit(x, y[None, :], w, sign, lower)[0]
    res = least_squares(lambda t: np.sqrt(w) * (_model(t, x, sign) - y), theta0, method="trf",
                        bounds=([lower, 0.0, ALPHA_BOUNDS[0]], [np.inf, np.inf, ALPHA_BOUNDS[1]]))
    cost0 = float((w * (_model(theta0, x, sign) - y) ** 2).sum())
    return res.x if res.success and 2 * res.cost <= cost0 else theta0


def _derived(theta: np.ndarray, sign: int) -> dict[str, float]:
    y_inf, a, alpha = theta
    return {"gain": a * (1.0 - 2.0 ** (-alpha)), "fit_nmax": y_inf + sign * a,
            "2x": y_inf + sign * a * MAX_PROJECTION ** (-alpha)}


def local_gain(n, mean, counts, sign, sigma, df, level, shifts: np.ndarray | None = None) -> Estimate:
    """Improvement per doubling between the two largest N, straight from the means (no curve assumed): a t
    interval from the seed-to-seed sigma given, widened in quadrature by the validation-sample bootstrap of the
    difference (`shifts` [n_boot, k]) when given. Model-free: the curve's misfit is not noise of these means."""
    if len(n) < 2:
        return Estimate(NAN)
    doublings = math.log2(n[-1] / n[-2])
    value = sign * (mean[-2] - mean[-1]) / doublings
    if not (math.isfinite(sigma) and df > 0):
        return Estimate(value)
    half = t_quantile(level, df) * sigma * math.sqrt(1 / counts[-1] + 1 / counts[-2]) / doublings
    if shifts is not None and shifts.shape[0] >= 10:
        tail = (1.0 - level) / 2.0 * 100.0
        lo, hi = np.percentile((shifts[:, -1] - shifts[:, -2]) / doublings, [tail, 100.0 - tail])
        half = math.hypot(half, (hi - lo) / 2.0)
    return Estimate(value, value - half, value + half)


def fit_power_law(metric: str, n_groups: list[tuple[float, np.ndarray]], sign: int, lower: float = 0.0,
                  seed_sigma: float = NAN, seed_df: int = 0, level: float = 0.9, n_boot: int = 400,
                  seed: int = 0, min_points: int = 3, shifts: np.ndarray | None = None,
                  material: float = NAN) -> PowerLawFit:
    """Fits y(N) on per-N groups of replicate values [(N, values), ...]; intervals by the bootstrap above.

    `lower` bounds y_inf from below (0 for a loss, 1 for tau). `shifts` [n_boot, groups]: the validation-sample
    bootstrap's shift of each group's mean (valnoise.ValNoise.group_shift). `material`: the line a ceiling's
    families must agree within (families.ceiling). Deterministic for a given `seed`.
    """
    keep = [i for i, (_, v) in enumerate(n_groups) if len(v)]
    n_groups = [n_groups[i] for i in keep]
    if shifts is not None:
        shifts = shifts[:, keep]
    n = np.array([g[0] for g in n_groups], dtype=float)
    mean = np.array([np.mean(g[1]) for g in n_groups], dtype=float)
    counts = np.array([len(g[1]) for g in n_groups], dtype=float)
    fit = PowerLawFit(metric, sign, n, mean, counts, sigma=seed_sigma, sigma_df=seed_df,
                      sigma_source="seeds" if seed_df > 0 else "none", val_noise=shifts is not None)
    if len(n) < min_points:
        fit.local_gain = local_gain(n, mean, counts, sign, seed_sigma, seed_df, level, shifts)
        fit.note = f"{len(n)} data size(s): a power law needs at least {min_points}"
        return fit
    x = n / n[-1]
    theta = _fit(x, mean, counts, sign, lower)
    fit.ok = True
    # Residual sd of a single run (the means are weighted by their counts), from lack of fit.
    resid_df = len(n) - 3
    if resid_df > 0:
        resid_sigma = math.sqrt(float((counts * (_model(theta, x, sign) - mean) ** 2).sum()) / resid_df)
        if not (seed_df > 0 and seed_sigma >= resid_sigma):
            fit.sigma, fit.sigma_df, fit.sigma_source = resid_sigma, resid_df, "fit residuals"
        if seed_df > 0 and seed_sigma > 0:
            fit.misfit = resid_sigma / seed_sigma
    # model-free: the seeds' own noise where there are seeds, else the only noise estimate there is
    sigma, df = (seed_sigma, seed_df) if seed_df > 0 else (fit.sigma, fit.sigma_df)
    fit.local_gain = local_gain(n, mean, counts, sign, sigma, df, level, shifts)
    point = _derived(theta, sign)
    grid = np.geomspace(n[0], MAX_PROJECTION * n[-1], 60)
    curve = _model(theta, grid / n[-1], sign)
    boot = _bootstrap(theta, x, counts, sign, lower, fit.sigma, fit.sigma_df, grid / n[-1], n_boot, seed, shifts)
    if boot is None:
        fit.note = "no noise estimate (no seeds and no more data sizes than parameters): intervals unknown"
        thetas, derived, curves = np.empty((0, 3)), {k: np.empty(0) for k in point}, None
    else:
        thetas, derived, curves = boot
    names = ("y_inf", "A_at_nmax", "alpha")
    fit.params = {k: percentile_estimate(float(theta[i]), thetas[:, i], level) for i, k in enumerate(names)}
    fit.gain_per_doubling = percentile_estimate(point["gain"], derived["gain"], level)
    fit.fitted_nmax = percentile_estimate(point["fit_nmax"], derived["fit_nmax"], level)
    fit.projections = {"2x": percentile_estimate(point["2x"], derived["2x"], level)}
    if curves is not None:
        tail = (1.0 - level) / 2.0 * 100.0
        lo, hi = np.nanpercentile(curves, [tail, 100.0 - tail], axis=0)
        fit.band = (grid, curve, lo, hi)
    else:
        fit.band = (grid, curve, curve, curve)
    power = FamilyFit("power law", fit.gain_per_doubling, fit.projections["2x"], fit.params["y_inf"],
                      fit.fitted_nmax, fit.band)
    quad = log_quadratic(n, mean, counts, sign, fit.sigma, fit.sigma_df, shifts, level, n_boot, seed + 1)
    fit.families = [power] + ([quad] if quad is not None else [])
    fit.ceiling, fit.ceiling_note = ceiling(n, fit.families, material, fit.misfit)
    return fit


def _bootstrap(theta, x, counts, sign, lower, sigma, df, grid_x, n_boot, seed, shifts=None):
    ys = noise_draws(_model(theta, x, sign), counts, sigma, df, shifts, n_boot, seed)
    if ys is None:
        return None
    thetas = _profile_fit(x, ys, counts, sign, lower)
    curves = _model(thetas.T[:, :, None], grid_x[None, :], sign)
    derived = _derived(thetas.T, sign)
    return thetas, derived, curves
