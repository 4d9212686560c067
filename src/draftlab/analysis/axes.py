"""The two axes a draft can be short on: optimizer steps (S) and data (N), each measured with the other held.

Per-axis fits with the other axis fixed (the grid of `experiment=steps_vs_data` gives both):
  - steps axis:          at the largest N that has two or more step budgets, the metric against S;
  - data at equal steps: at the largest step budget that has two or more data sizes, the metric against N;
  - data at convergence: runs whose early stopping fired (`train/stopped_early` = 1), against N;
  - steps probe:         where no step budgets vary, at the largest N holding both, converged runs against their
                         steps probes (`train.extend_steps`: on past the plateau at constant lr, then decayed).
Each is a power law (`fit.fit_power_law`, parametric bootstrap) when it has `min_points` values, else the
model-free gain per doubling between its two largest values, with a parametric bootstrap of the cell means.
A run that hit its step budget is a point on the steps axis; a converged run is not (its S was not chosen).

The noise is the pooled seed-to-seed sd of the cells; with no replicates at all it is an assumed sd
(`Thresholds.assumed_noise_rel` of the loss, `assumed_noise_tau` of tau), and the report says so. Where the runs
hold per-sample validation results, each bootstrap replicate adds the paired validation-sample shifts
(valnoise.py) as well.

Prices are GPU-seconds from the runs' own `<stage>/seconds`, for the doubling the gain describes, added to
what the baseline draft cost: a doubling of steps costs the steps it adds (training goes on from the
checkpoint, as the steps probe does), a doubling of data costs generating and extracting as many new samples
again plus a run at the same steps. A stage a job reused from the cache counts at what the job that made it
paid (its seconds over its new samples), never at the ~0 s of the reuse.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from draftlab.analysis.fit import PowerLawFit, fit_power_law
from draftlab.analysis.records import Run, by_group, direction, step_clusters, values
from draftlab.analysis.stats import NAN, Estimate, percentile_estimate, pooled_sd
from draftlab.analysis.valnoise import ValNoise

ASSUMED_DF = 1000  # an assumed sd is taken as known: normal rather than Student-t intervals


@dataclass
class Axis:
    name: str  # steps | steps probe | data@steps | data@convergence
    metric: str
    held: str  # what is held fixed, in words
    x: np.ndarray  # the axis values (S or N), ascending
    mean: np.ndarray
    counts: np.ndarray
    gain: Estimate  # improvement of the next doubling of this axis (> 0 = better)
    fit: PowerLawFit | None = None
    x_max: float = NAN
    samples_at: float = NAN  # data.samples where the axis was measured (for pricing)
    steps_at: float = NAN  # steps where the axis was measured (for pricing)
    seconds: float = NAN  # price of the next doubling, from measured stage seconds
    note: str = ""
    start: tuple = ()  # the joint lever's first cell: (data.samples, steps, plateau step, wsd decay ratio)
    alone: "Axis | None" = None  # the joint lever's data alone over its two sizes (levers.py)


@dataclass
class Axes:
    metric: str
    sigma: float
    df: int
    noise_source: str  # seeds | assumed
    steps: Axis | None = None
    data_at_steps: Axis | None = None
    data_at_convergence: Axis | None = None
    confound: str = ""  # non-empty: the data series also changed the steps, and nothing separates them
    costs: dict[str, float] = field(default_factory=dict)
    capped: list[float] = field(default_factory=list)  # N whose early-stopping runs all hit train.max_steps
    # loss a doubling of steps would still buy at the val/loss slope left when early stopping fired (largest N)
    remaining: Estimate | None = None
    remaining_at: float = NAN  # the N it was read at

    @property
    def data(self) -> Axis | None:
        """The data axis that answers "does more data help?": at convergence first, else at equal steps."""
        return self.data_at_convergence or self.data_at_steps


def _gain_boot(x, mean, counts, sign, sigma, df, level, n_boot, seed, shifts=None) -> Estimate:
    """Improvement per doubling between the two largest x, with a parametric bootstrap of the two means (plus
    their validation-sample shifts [n_boot, 2], when given)."""
    doublings = math.log2(x[-1] / x[-2])
    value = sign * (mean[-1] - mean[-2]) / doublings
    have_sigma = math.isfinite(sigma) and df > 0
    if not (have_sigma or shifts is not None) or n_boot <= 0:
        return Estimate(value)
    rng = np.random.default_rng(seed)
    draws = np.repeat(mean[-2:][None, :], n_boot, axis=0)
    if have_sigma:
        sigmas = sigma * np.sqrt(df / rng.chisquare(df, size=n_boot))
        draws = draws + rng.standard_normal((n_boot, 2)) * sigmas[:, None] / np.sqrt(counts[-2:])
    if shifts is not None:
        draws = draws + shifts[:, -2:]
    return percentile_estimate(value, sign * (draws[:, 1] - draws[:, 0]) / doublings, level)


def _axis(name, metric, held, points: list[tuple[float, list[Run]]], sigma, df, level, n_boot, seed,
          min_points, vnoise: ValNoise | None = None) -> Axis | None:
    """points: [(x, runs)] -> an Axis, or None with fewer than two x values holding the metric."""
    pts = sorted(((x, values(rs, metric), [r for r in rs if math.isfinite(r.value(metric))]) for x, rs in points),
                 key=lambda p: p[0])
    pts = [p for p in pts if p[1].size]
    if len(pts) < 2:
        return None
    x = np.array([p[0] for p in pts], dtype=float)
    mean = np.array([p[1].mean() for p in pts])
    counts = np.array([p[1].size for p in pts], dtype=float)
    shifts = None
    if vnoise is not None and vnoise.shifts and n_boot > 0:
        shifts = np.stack([vnoise.group_shift(p[2], n_boot) for p in pts], axis=1)
    sign = direction(metric)
    fit = None
    gain = _gain_boot(x, mean, counts, sign, sigma, df, level, n_boot, seed, shifts)
    if len(pts) >= min_points:
        fit = fit_power_law(metric, [(p[0], p[1]) for p in pts], sign=-sign, lower=1.0 if sign > 0 else 0.0,
                            seed_sigma=sigma, seed_df=df, level=level, n_boot=n_boot, seed=seed,
                            min_points=min_points, shifts=shifts)
        if fit.ok and fit.gain_per_doubling.known:
            gain = fit.gain_per_doubling
    return Axis(name, metric, held, x, mean, counts, gain, fit, float(x[-1]))


def _noise(runs: list[Run], metric: str, clusters: dict, th) -> tuple[float, int, str]:
    cells: dict[tuple, list[Run]] = defaultdict(list)
    for r in runs:
        cells[(r.config, r.group, "p" if r.probe else "c" if r.converged else clusters.get(r.run_id, NAN))].append(r)
    sigma, df = pooled_sd(values(c, metric) for c in cells.values())
    if df > 0:
        return sigma, df, "seeds"
    if direction(metric) > 0:
        return th.assumed_noise_tau, ASSUMED_DF, "assumed"
    level = float(np.nanmean([r.value(metric) for r in runs]))
    return th.assumed_noise_rel * abs(level), ASSUMED_DF, "assumed"


def measure_axes(runs: list[Run], metric: str, th, level: float, n_boot: int, seed: int,
                 vnoise: ValNoise | None = None) -> Axes:
    """Both axes of one metric over the runs of one config (the baseline's)."""
    clusters = step_clusters(runs)
    sigma, df, source = _noise(runs, metric, clusters, th)
    out = Axes(metric, sigma, df, source, costs=stage_costs(runs))
    args = (sigma, df, level, n_boot, seed, th.min_points, vnoise)
    budget = [r for r in runs if r.run_id in clusters]
    # steps axis at the largest N with two or more budgets
    for n, group in reversed(by_group(budget)):
        by_s = defaultdict(list)
        for r in group:
            by_s[clusters[r.run_id]].append(r)
        samples = _samples(group)
        held = f"N={n:.4g}" + (f", {samples:.0f} samples" if math.isfinite(samples) and samples != n else "")
        axis = _axis("steps", metric, held, list(by_s.items()), *args)
        if axis is not None:
            axis.samples_at, axis.steps_at = _samples(group), axis.x_max
            out.steps = axis
            break
    # data at the largest step budget with two or more data sizes
    by_s = defaultdict(list)
    for r in budget:
        by_s[clusters[r.run_id]].append(r)
    for s in sorted(by_s, reverse=True):
        axis = _axis("data@steps", metric, f"S={s:.4g} steps", by_group(by_s[s]), *args)
        if axis is not None:
            axis.samples_at, axis.steps_at = _samples(by_group(by_s[s])[-1][1]), s
            out.data_at_steps = axis
            break
    if out.steps is None:
        out.steps = _probe_axis(runs, metric, args)
    converged = [r for r in runs if r.converged and not r.probe]
    groups = by_group(converged)
    axis = _axis("data@convergence", metric, "each N trained to convergence", groups, *args)
    if axis is not None:
        axis.samples_at = _samples(groups[-1][1])
        axis.steps_at = float(np.nanmean([r.steps for r in groups[-1][1]]))
        out.data_at_convergence = axis
    if direction(metric) < 0:
        out.remaining, out.remaining_at = remaining_gain(converged)
    out.confound = _confound(runs, out)
    out.capped = capped_sizes(runs)
    _price(out)
    return out


SLOPE_KEY = "train/final_slope"  # val/loss per 1000 steps over the last passes, with _lo and _hi


def remaining_gain(converged: list[Run]) -> tuple[Estimate | None, float]:
    """At the largest N whose converged runs recorded it: -slope x steps at the plateau, the loss a doubling of
    steps would buy if val/loss kept falling as it did when early stopping fired (an upper bound: curves
    flatten). Records without `train/plateau_step` count their final steps."""
    for n, group in reversed(by_group(converged)):
        rows = [(r.value(SLOPE_KEY), r.value(SLOPE_KEY + "_lo"), r.value(SLOPE_KEY + "_hi"),
                 r.value("train/plateau_step") if math.isfinite(r.value("train/plateau_step")) else r.steps)
                for r in group]
        rows = [row for row in rows if all(math.isfinite(v) for v in row)]
        if rows:
            slope, lo, hi, steps = (np.array(c) for c in zip(*rows))
            scale = steps / 1000.0
            return Estimate(float(np.mean(-slope * scale)), float(np.mean(-hi * scale)),
                            float(np.mean(-lo * scale))), n
    return None, NAN


def _probe_axis(runs: list[Run], metric: str, args) -> Axis | None:
    """At the largest N with both, the converged runs and their steps probes: the steps a plateau left unused."""
    for n, group in reversed(by_group([r for r in runs if r.converged])):
        base, probes = [r for r in group if not r.probe], [r for r in group if r.probe]
        s0, s1 = _median_steps(base), _median_steps(probes)
        if not (base and probes and math.isfinite(s0) and math.isfinite(s1) and s1 > s0):
            continue
        extend = float(np.median([r.params["train.extend_steps"] for r in probes]))
        held = f"N={n:.4g}, plateau + {extend:.4g} steps at constant lr"
        axis = _axis("steps probe", metric, held, [(s0, base), (s1, probes)], *args)
        if axis is not None:
            axis.samples_at, axis.steps_at = _samples(group), s1
            return axis
    return None


def _samples(runs: list[Run]) -> float:
    s = [r.params.get("data.samples") for r in runs if isinstance(r.params.get("data.samples"), (int, float))]
    return float(np.median(s)) if s else NAN


def _confound(runs: list[Run], axes: Axes) -> str:
    """Why the data axis cannot be read, when nothing separates data from steps; '' when it can."""
    if axes.steps is not None or axes.data_at_convergence is not None or axes.data_at_steps is not None:
        return ""
    groups = by_group(runs)
    if len(groups) < 2:
        return ""
    s_lo, s_hi = _median_steps(groups[0][1]), _median_steps(groups[-1][1])
    n_ratio = groups[-1][0] / groups[0][0]
    if math.isfinite(s_lo) and math.isfinite(s_hi) and s_hi > 1.5 * s_lo:
        return (f"steps confound: from N={groups[0][0]:.4g} to N={groups[-1][0]:.4g} ({n_ratio:.3g}x data) the "
                f"runs also took {s_hi / s_lo:.3g}x the optimizer steps ({s_lo:.4g} -> {s_hi:.4g}), and no run "
                "converged (early stopping) nor shares a step budget with another N, so the gain of data cannot "
                "be told from the gain of steps")
    if not any(math.isfinite(r.steps) for r in runs):
        return ("steps unknown: the runs record neither train/steps nor train/stopped_early, so whether they "
                "were trained to convergence, and how long, cannot be told")
    if any(r.converged for r in runs):
        return ("fewer than two data sizes converged (early stopping) and no N was trained at two step budgets, "
                "so the gain of data at convergence is not measured")
    return ("no run converged (early stopping) and no N was trained at two step budgets, so the gain of data "
            "at convergence is not measured")


def capped_sizes(runs: list[Run]) -> list[float]:
    """Data sizes where early stopping was on but every run reached its step cap: the early-stopping record says
    they were still improving materially, so they are under-trained and not on the converged data axis."""
    out = []
    for n, group in by_group(runs):
        watched = [r for r in group if r.params.get("train.early_stop_patience") and r.params.get("train.max_steps")]
        if watched and all(not r.converged and r.steps >= r.params["train.max_steps"] for r in watched):
            out.append(n)
    return out


def _median_steps(runs: list[Run]) -> float:
    steps = [r.steps for r in runs if math.isfinite(r.steps)]
    return float(np.median(steps)) if steps else NAN


def _new_steps(r: Run) -> float:
    own = r.value("train/new_steps")
    return own if math.isfinite(own) else r.steps


def stage_costs(runs: list[Run]) -> dict[str, float]:
    """Seconds per optimizer step (train) and per new sample (generate, extract), from the runs' stage times.

    Stages that were cached (a shared pool filled by a larger job) report ~0 s: only runs that did new work
    count, divided by the work they did. A resumed (or `init_from`) training job's seconds are its last process's,
    so they are divided by that process's steps (`train/new_steps`, as the pools' `<stage>/new_samples`; older
    records: all steps).
    """
    out: dict[str, float] = {}
    done = [(r.value("train/seconds"), _new_steps(r)) for r in runs if r.value("train/cached") != 1.0]
    per_step = [seconds / steps for seconds, steps in done if seconds > 0 and steps > 0]
    if per_step:
        out["train_s_per_step"] = float(np.median(per_step))
    for stage in ("generate", "extract"):
        # a cached job reports the producing job's new samples beside its own ~0 s: only the producers count
        made = [r for r in runs if r.value(f"{stage}/cached") != 1.0]
        secs = [r.value(f"{stage}/seconds") for r in made]
        work = [r.value(f"{stage}/new_samples") for r in made]
        done = [(s, w) for s, w in zip(secs, work) if math.isfinite(s) and math.isfinite(w) and w > 0]
        if done:
            out[f"{stage}_s_per_sample"] = sum(s for s, _ in done) / sum(w for _, w in done)
    return out


def _price(axes: Axes) -> None:
    c = axes.costs
    step_s = c.get("train_s_per_step", NAN)
    sample_s = c.get("generate_s_per_sample", NAN) + c.get("extract_s_per_sample", NAN)
    if axes.steps is not None:
        axes.steps.seconds = steps_price(axes.steps, step_s)
    data = axes.data
    if data is not None:  # as many new samples again, then a run at the same steps
        data.seconds = data.samples_at * sample_s + data.steps_at * step_s


def steps_price(axis: Axis, step_s: float) -> float:
    """Seconds of the doubling of steps the gain describes: the next one (x_max more steps) on a fitted axis,
    the last measured one (the steps between the two largest budgets, per doubling) on two points."""
    if axis.fit is not None and axis.fit.ok:
        return axis.x_max * step_s
    return (axis.x[-1] - axis.x[-2]) * step_s / math.log2(axis.x[-1] / axis.x[-2])
