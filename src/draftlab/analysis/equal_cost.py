"""Comparisons at equal cost: a setting against the baseline at the same step count and at the same GPU-seconds.

A capacity or feature setting trained to its own plateau stops at another step count than the baseline, and a
larger draft pays more per step: compared as trained, its gain mixes the setting with the steps. So each
comparison at equal data (compare.py) is also read with the baseline moved along its own steps axis at that
size (axes.py: the steps probe or a step budget grid), by the gain per doubling of steps g:
  - equal steps:       the baseline at the other setting's steps,  shift g x log2(S_other / S_baseline);
  - equal GPU-seconds: the baseline at the other setting's training seconds, shift g x log2(T_other / T_base).
The log ratios are means over seeds both cells share (each seed's pair), else of the cells' medians. The
interval adds g's interval x |log ratio| to the comparison's in quadrature. The verdict uses equal GPU-seconds
(the user's price) when both cells record their training seconds, else equal steps.

The finding is `unresolved`, with the reason, when the baseline is not converged at that size (early stopping
did not fire in every baseline run, or the steps axis there still gains a material amount: a baseline still
improving makes any difference a difference in steps), when the cells trained to other step counts (more than
`SAME_STEPS` apart) and no steps axis at that size can move the baseline, or when the move would reach past one
doubling beyond the steps measured there.
"""

from __future__ import annotations

import math
import numpy as np

from draftlab.analysis.axes import Axes, _samples
from draftlab.analysis.compare import Comparison, Contrast, as_trained
from draftlab.analysis.records import Run, by_group, differs_only_in
from draftlab.analysis.stats import Estimate
from draftlab.analysis.verdict import Thresholds, axis_state

SAME_STEPS = 1.1  # step counts within 10% are equal steps (token-budget batching: 380 and 384)


def _cell(runs: list[Run], baseline: tuple, c: Comparison, label: str) -> list[Run]:
    pool = [r for r in runs if differs_only_in(r.config, baseline, c.key) and not r.probe
            and dict(r.config).get(c.key, "None") == label]
    return next((g for n, g in by_group(pool) if math.isclose(n, c.n, rel_tol=1e-9)), [])


def _train_seconds(r: Run) -> float:
    """Seconds the run's training cost: its seconds per step of its own process, times all its steps."""
    own = r.value("train/new_steps")
    per_step = r.value("train/seconds") / (own if math.isfinite(own) and own > 0 else r.steps)
    return per_step * r.steps if per_step > 0 else math.nan


def log_ratio(base: list[Run], other: list[Run], of) -> float:
    """Mean log2(other / base) of `of(run)` over the seeds both cells hold, else of the cells' medians."""
    seeds = {r.params.get("train.seed"): of(r) for r in base}
    pairs = [(seeds[r.params.get("train.seed")], of(r)) for r in other if r.params.get("train.seed") in seeds]
    pairs = [(b, o) for b, o in pairs if b > 0 and o > 0]
    if pairs:
        return float(np.mean([math.log2(o / b) for b, o in pairs]))
    b, o = np.nanmedian([of(r) for r in base]), np.nanmedian([of(r) for r in other])
    return math.log2(o / b) if b > 0 and o > 0 else math.nan


def _moved(raw: Estimate, g: Estimate, doublings: float, base_is_better: bool) -> Estimate | None:
    if not (math.isfinite(doublings) and raw.known and g.known):
        return None
    shift = g.value * doublings * (1.0 if base_is_better else -1.0)
    half = math.hypot((raw.hi - raw.lo) / 2.0, abs(doublings) * (g.hi - g.lo) / 2.0)
    return Estimate(raw.value + shift, raw.value + shift - half, raw.value + shift + half)


def contrast(c: Comparison, runs: list[Run], baseline: tuple, axes: Axes | None, th: Thresholds) -> Contrast | None:
    """The comparison's contrast (best over worst for features, best over the baseline otherwise) at equal
    steps and GPU-seconds; None when the best setting is the baseline of a non-feature factor."""
    out = as_trained(c)
    if out is None:
        return None
    better, over, raw = out.better, out.over, out.as_trained
    if c.baseline not in (better, over):
        out.unresolved = "neither setting is the baseline, whose steps axis would put them at equal cost"
        return out
    other = over if better == c.baseline else better
    base, rest = _cell(runs, baseline, c, c.baseline), _cell(runs, baseline, c, other)
    steps = axes.steps if axes is not None else None
    if steps is not None and not math.isclose(steps.samples_at, _samples(base), rel_tol=1e-9):
        steps = None  # the steps axis was measured at another size
    not_conv = [r for r in base if not r.converged]
    if not_conv:
        out.unresolved = (f"the baseline is not converged at N={c.n:.4g}: early stopping did not fire in "
                          f"{len(not_conv)} of its {len(base)} runs")
    elif steps is not None and axis_state(steps, th)[0] == "limited":
        out.unresolved = (f"the baseline is not converged at N={c.n:.4g}: the next doubling of steps there still "
                          f"gains {steps.gain.fmt()} in {c.metric}")
    d_steps = log_ratio(base, rest, lambda r: r.steps)
    d_secs = log_ratio(base, rest, _train_seconds)
    base_is_better = better == c.baseline
    if steps is None:
        if math.isfinite(d_steps) and abs(d_steps) <= math.log2(SAME_STEPS):
            out.equal_steps = raw
        elif not out.unresolved:
            out.unresolved = (f"{other} trained {2 ** d_steps:.3g}x the baseline's steps and no steps axis at "
                              f"N={c.n:.4g} puts them at equal steps (a steps probe there would)")
        return out
    out.equal_steps = _moved(raw, steps.gain, d_steps, base_is_better)
    reach = math.log2(2.0 * steps.x_max / float(np.median([r.steps for r in base])))
    if math.isfinite(d_secs) and d_secs <= reach:
        out.equal_seconds = _moved(raw, steps.gain, d_secs, base_is_better)
    elif math.isfinite(d_secs) and not out.unresolved:
        out.unresolved = (f"at equal GPU-seconds the baseline would train {2 ** d_secs:.3g}x its steps, past one "
                          "doubling beyond the steps measured")
    return out


def contrasts(comparisons: list[Comparison], runs: list[Run], baseline: tuple, axes: dict[str, Axes],
              th: Thresholds) -> list[Contrast]:
    out = [contrast(c, runs, baseline, axes.get(c.metric), th) for c in comparisons]
    return [x for x in out if x is not None]
