"""The answer a person reads first: one sentence per lever, in the verdict's metric, each with its interval and
its price, then the verdict and the cheapest lever per line. The report opens with it, the sweep's MLflow
parent run holds it (tag `verdict.headline`, text `analysis/answer.md`) and the sweep's terminal summary prints
it: one text, three places.
"""

from __future__ import annotations

import math

from draftlab.analysis.compare import Contrast
from draftlab.analysis.fit import PowerLawFit
from draftlab.analysis.levers import Lever, cheapest, fmt_seconds
from draftlab.analysis.records import PREDICTED_TAU_KEY, TAU_KEY
from draftlab.analysis.verdict import Thresholds, Verdict, material

NAMES = {TAU_KEY: "deployed tau (bench/tau)", PREDICTED_TAU_KEY: "predicted tau (val/predicted_tau)"}
STATES = {"limited": "clears the line", "flat": "below the line (even its interval's upper end)",
          "unresolved": "not resolved (its interval straddles the line)",
          "insufficient": "too few sizes to project the next doubling",
          "with-data": "clears the line, as data alone over the same sizes does"}


def _unit(metric: str) -> str:
    return "tau" if metric in NAMES else "loss"


def _lever(lv: Lever, line: float, unit: str, only: bool) -> str:
    price = lv.per_line(line)
    cost = (f"for {lv.seconds:,.0f} GPU-s ({fmt_seconds(price)} s per {line:.3g} {unit})" if math.isfinite(price.value)
            else "at an unknown price")
    state = "the only lever that clears the line" if only else STATES.get(lv.state, lv.state)
    return f"{lv.what} gains {lv.gain.fmt()} {cost}: {state}."


def _contrast(x: Contrast, th: Thresholds) -> str:
    c = x.comparison
    m = material(c.metric, next((lv.mean for lv in c.levels if lv.baseline), float("nan")), th)
    head = f"{c.key}={x.better} over {x.over}"
    if x.unresolved:
        return f"{head}: unresolved, {x.unresolved} (as trained {x.as_trained.fmt()})."
    beside = [f"{e.fmt()} {name}" for name, e in (("at equal steps", x.equal_steps), ("as trained", x.as_trained))
              if e is not None and e is not x.used]
    e = x.used
    clears = e.value >= m and e.lo > th.near_zero_fraction * m
    state = "clears the line" if clears else "below the line" if e.hi < m else "not resolved"
    return f"{head} gains {e.fmt()} at {x.basis}" + (f" ({'; '.join(beside)})" if beside else "") + f": {state}."


def answer(v: Verdict, found: list[Lever], contrasts: list[Contrast], fit: PowerLawFit | None, th: Thresholds,
           missing_run: str = "") -> str:
    """The first paragraph of the report (module docstring)."""
    metric = v.metric
    unit = _unit(metric)
    line = material(metric, fit.mean[-1] if fit is not None and len(fit.mean) else float("nan"), th)
    clearing = [lv for lv in found if lv.state == "limited"]
    parts = [f"**Answer in {NAMES.get(metric, metric)}, against a line of {line:.3g} {unit}** (prices are "
             "GPU-seconds from the jobs' stage times; the intervals' sources are said below):"]
    parts += [_lever(lv, line, unit, len(clearing) == 1 and lv is clearing[0] and len(found) > 1) for lv in found]
    parts += [_contrast(x, th) for x in contrasts if x.comparison.metric == metric]
    best = cheapest(found, line)
    if best is not None:
        tail = "" if best.state == "limited" else ", at a rate its next doubling alone does not carry past the line"
        parts.append(f"Cheapest per {line:.3g} {unit}: {best.what.split(' (')[0]}, "
                     f"{fmt_seconds(best.per_line(line))} GPU-s{tail}.")
    parts.append(f"Verdict: {v.plain} (`{v.tag}`).")
    if missing_run and any(lv.name == "joint" for lv in found):
        parts.append("Whether the joint lever beats steps alone at equal GPU-seconds needs a run the records lack: "
                     f"`{missing_run}`.")
    return " ".join(parts)
