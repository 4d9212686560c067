"""The levers a user can pull, in the verdict's metric, each with its gain, its price and its price per line.

A lever is 2x steps, 2x data, or both together (`joint`): a larger data size trained for more steps. Doubling
one of them may buy less than the material line while doubling both buys more (the steps a larger set needs
are part of what the data is worth), so the joint lever is measured on its own: between two cells of the
baseline config whose sizes differ by about a doubling (`JOINT_N_RATIO`) and whose step counts differ by at
least `JOINT_MIN_S_RATIO` (converged runs, steps probes or step budgets), the largest such pair. Its gain is
per doubling of data, with the same bootstrap as the other axes (axes._axis); its price is the new samples
plus a run at the larger step count.

Every lever's price per line (GPU-seconds per `material_tau`) is its price divided by its gain in lines, with
the interval from the gain's: a lever whose interval reaches 0 has no upper price. The cheapest lever is the
one with the lowest point price among those whose gain's interval excludes 0.

A joint gain read over an earlier doubling than the data axis' next one is larger for that alone (returns
diminish), so the joint lever also carries data alone over its own two sizes (`Axis.alone`, each converged):
the verdict calls the joint lever the answer only when that does not clear the line either.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from draftlab.analysis.axes import Axes, Axis, _axis, _samples
from draftlab.analysis.records import Run, by_group, step_clusters
from draftlab.analysis.stats import NAN, Estimate

JOINT_N_RATIO = (1.5, 3.0)  # the data sizes of a joint step: about one doubling
JOINT_MIN_S_RATIO = 1.5  # and steps that grew with them, not a data step at equal steps


@dataclass
class Lever:
    name: str  # steps | data | joint
    what: str  # what is done, in words ("2x steps at N=..., plateau + 4000 steps at constant lr")
    gain: Estimate  # the verdict metric's improvement per doubling
    seconds: float  # GPU-seconds the doubling adds
    state: str = "unresolved"  # limited (clears the line) | flat | unresolved

    def per_line(self, line: float) -> Estimate:
        """GPU-seconds per `line` of gain at this doubling's rate: [seconds at the gain's upper end, at its
        lower end] (inf when the lower end is not above 0); NaN when the price or the gain is not positive."""
        g = self.gain
        if not (math.isfinite(self.seconds) and self.seconds > 0 and g.value > 0):
            return Estimate(NAN)
        value = self.seconds * line / g.value
        if not g.known:
            return Estimate(value)
        lo = self.seconds * line / g.hi if g.hi > 0 else math.inf
        hi = self.seconds * line / g.lo if g.lo > 0 else math.inf
        return Estimate(value, lo, hi)


def _cells(runs: list[Run]) -> list[tuple[float, float, list[Run], object]]:
    """(N, steps, runs, kind) per cell of one config: converged runs, steps probes and step budgets apart."""
    clusters = step_clusters(runs)
    out = []
    for n, group in by_group(runs):
        kinds: dict[object, list[Run]] = {}
        for r in group:
            kind = "probe" if r.probe else "converged" if r.converged else clusters.get(r.run_id)
            kinds.setdefault(kind, []).append(r)
        for kind, rs in kinds.items():
            steps = [r.steps for r in rs if math.isfinite(r.steps)]
            if kind is not None and steps:
                out.append((n, float(np.median(steps)), rs, kind))
    return out


def joint_axis(runs: list[Run], metric: str, axes: Axes, level: float, n_boot: int, seed: int,
               vnoise=None, min_points: int = 3) -> Axis | None:
    """Data and steps doubled together (module docstring), priced from the axes' stage costs; None without a
    pair of cells that qualifies."""
    cells = _cells(runs)
    pairs = [(a, b) for a in cells for b in cells
             if JOINT_N_RATIO[0] <= b[0] / a[0] <= JOINT_N_RATIO[1] and b[1] / a[1] >= JOINT_MIN_S_RATIO]
    for a, b in sorted(pairs, key=lambda p: (p[1][0], p[0][0], p[1][1]), reverse=True):
        held = f"N {a[0]:.4g} -> {b[0]:.4g} with steps {a[1]:.4g} -> {b[1]:.4g}"
        axis = _axis("joint", metric, held, [(a[0], a[2]), (b[0], b[2])], axes.sigma, axes.df, level, n_boot,
                     seed, min_points, vnoise)
        if axis is None:
            continue
        axis.samples_at, axis.steps_at = _samples(b[2]), b[1]
        # data alone over the same two sizes (each converged): the joint lever is news only where it does not clear
        conv = [next((c for c in cells if c[0] == n and c[3] == "converged"), None) for n in (a[0], b[0])]
        if all(conv):
            axis.alone = _axis("data alone", metric, f"N {a[0]:.4g} -> {b[0]:.4g}, each trained to convergence",
                               [(c[0], c[2]) for c in conv], axes.sigma, axes.df, level, n_boot, seed + 1,
                               min_points, vnoise)
        plateau = [r.value("train/plateau_step") for r in a[2] if math.isfinite(r.value("train/plateau_step"))]
        decay = [r.params.get("train.decay_ratio") for r in a[2] if isinstance(r.params.get("train.decay_ratio"),
                                                                                 (int, float))]
        axis.start = (_samples(a[2]), a[1], float(np.median(plateau)) if plateau else NAN,
                      float(np.median(decay)) if decay else NAN)
        c = axes.costs
        sample_s = c.get("generate_s_per_sample", NAN) + c.get("extract_s_per_sample", NAN)
        new = _samples(b[2]) - _samples(a[2])
        doublings = math.log2(b[0] / a[0])
        axis.seconds = (new * sample_s + b[1] * c.get("train_s_per_step", NAN)) / doublings
        return axis
    return None


def levers(axes: Axes, joint: Axis | None, states: dict[str, str]) -> list[Lever]:
    """The steps, data and joint levers of the verdict metric's axes, with their states (verdict.axis_state)."""
    out = []
    for name, axis, words in (("steps", axes.steps, "2x steps"), ("data", axes.data, "2x data"),
                              ("joint", joint, "2x data and steps together")):
        if axis is not None:
            out.append(Lever(name, f"{words} ({axis.held})", axis.gain, axis.seconds, states.get(name, "unresolved")))
    return out


def cheapest(found: list[Lever], line: float) -> Lever | None:
    """The lever with the lowest price per line among those whose gain's interval excludes 0."""
    priced = [lv for lv in found if lv.gain.known and lv.gain.lo > 0 and math.isfinite(lv.per_line(line).value)]
    return min(priced, key=lambda lv: lv.per_line(line).value, default=None)


def equal_cost_run(axes: Axes, joint: Axis | None) -> str:
    """The sweep line that would put the joint lever against steps alone at equal cost ('' when the records
    cannot say): at the joint's first size, a steps probe (`train.extend_steps`) that adds the joint's
    GPU-seconds in steps. Under wsd a probe trains (plateau + extend) x (1 + decay_ratio) steps."""
    if joint is None or len(joint.start) < 4:
        return ""
    samples, steps, plateau, decay = joint.start
    step_s = axes.costs.get("train_s_per_step", NAN)
    total = steps + joint.seconds * math.log2(joint.x[-1] / joint.x[-2]) / step_s
    extend = total / (1.0 + (decay if math.isfinite(decay) else 0.0)) - plateau
    if not (math.isfinite(extend) and extend > 0 and math.isfinite(samples)):
        return ""
    return f"data.samples={samples:.0f} train.extend_steps={100 * round(extend / 100):.0f} train.seed=0"


def fmt_seconds(e: Estimate) -> str:
    """GPU-seconds as whole seconds with thousands separators, the interval's open end as 'inf'."""
    def one(v: float) -> str:  # a tiny sweep's seconds keep two digits rather than round to 0
        return ("inf" if not math.isfinite(v) else f"{v:,.0f}" if abs(v) >= 10 else f"{v:.2g}")

    return one(e.value) + (f" [{one(e.lo)}, {one(e.hi)}]" if e.known or math.isinf(e.hi) else "")
