"""The verdict: is the draft data-limited, at a bottleneck (features, capacity, optimisation), or can the
sweep not tell? Every rule is below, with its threshold in `Thresholds`.

Data axis (per fitted metric: validation loss, and bench/tau when benchmarked), from the gain per doubling g at
the largest N with its bootstrap interval [lo, hi] and a materiality threshold m (loss: `material_loss_rel` of
the loss at N_max; tau: `material_tau` absolute):
  - data-limited: g >= m and lo > `near_zero_fraction` * m (the interval excludes ~0 and the gain is material)
  - flat:         hi < m (even the optimistic end of the interval is not worth a doubling)
  - unresolved:   otherwise (the interval straddles m), or no interval (no noise estimate)
  - insufficient: fewer than `min_points` data sizes (a 3-parameter curve needs 3)
The sweep is data-limited if any metric is, flat if every fitted metric is, else unresolved/insufficient.

Bottleneck findings (counted only when resolved: the interval excludes ~0 and the effect is material):
  - features (direct):       two `extract.*` settings (layer sets) differ at equal data
  - capacity (direct):       a `draft.*` setting (layers, width) beats the baseline at equal data
  - optimisation (direct):   a `train.*` setting (epochs, lr) beats the baseline at equal data
  - optimisation (indirect): loss still falling by > `not_converged_rel_drop` over the last `tail_fraction`
                             of training at N_max, or train loss above val loss by > `train_above_val_rel`
  - capacity (indirect):     data axis flat and |val - train| < `small_gap_rel` of val: the draft does not
                             overfit and more data does not help, so it cannot represent more
Verdict: data-limited wins (other findings are listed as "also"). Otherwise a non-converged training run
comes first (it confounds every other comparison), then the direct finding with the largest effect (in units
of m), then indirect ones. A flat curve with no finding is a bottleneck "unidentified"; anything else is
undetermined, with what to run next.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from draftlab.analysis.compare import Comparison
from draftlab.analysis.fit import PowerLawFit
from draftlab.analysis.records import TAU_KEY
from draftlab.analysis.stats import Estimate


@dataclass(frozen=True)
class Thresholds:
    material_loss_rel: float = 0.01  # a loss change worth having: 1% of the loss at N_max (0.06 at 6.13)
    material_tau: float = 0.1  # a tau change worth having; EAGLE-3 gains 0.3-0.4 per doubling, EAGLE-2 ~0
    near_zero_fraction: float = 0.25  # "excludes ~0": the lower bound must clear this fraction of material
    min_points: int = 3  # distinct data sizes needed for a power-law fit
    small_gap_rel: float = 0.05  # |val - train| / val below this: no overfitting
    train_above_val_rel: float = 0.05  # train loss this far above val: the optimiser has not fit the data
    not_converged_rel_drop: float = 0.02  # loss still falling this much over the last part of training
    tail_fraction: float = 0.25  # "the last part of training"


@dataclass
class Finding:
    category: str  # features | capacity | optimisation | other
    direct: bool  # from a controlled comparison (True) or a heuristic (False)
    effect: float  # size in units of the materiality threshold, for ranking
    text: str
    confound: bool = False  # non-converged training: rank first


@dataclass
class Verdict:
    kind: str  # data-limited | bottleneck | undetermined
    bottleneck: str | None  # features | capacity | optimisation | unidentified (kind == bottleneck)
    headline: str
    data_state: str  # limited | flat | unresolved | insufficient
    evidence: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)

    @property
    def tag(self) -> str:
        return f"bottleneck:{self.bottleneck}" if self.kind == "bottleneck" else self.kind

    @property
    def plain(self) -> str:
        return f"at a bottleneck ({self.bottleneck})" if self.kind == "bottleneck" else self.kind


def material(metric: str, reference: float, th: Thresholds) -> float:
    return th.material_tau if metric.startswith(TAU_KEY) else th.material_loss_rel * abs(reference)


def _resolved(e: Estimate, m: float, th: Thresholds) -> bool:
    return e.known and e.value >= m and e.lo > th.near_zero_fraction * m


def data_state(fit: PowerLawFit, m: float, th: Thresholds) -> tuple[str, str]:
    """(state, sentence) for one metric's data-scaling fit."""
    g = fit.gain_per_doubling
    where = f"{fit.metric}: gain per doubling at N={fit.n_max:.3g} is {g.fmt()} (material: {m:.3g})"
    if not fit.ok:
        return "insufficient", f"{fit.metric}: {fit.note}; local gain per doubling {fit.local_gain.fmt()}"
    if not g.known:
        return "unresolved", f"{where}; {fit.note}"
    if _resolved(g, m, th):
        return "limited", f"{where}: more data clearly helps"
    if g.hi < m:
        return "flat", f"{where}: even the upper bound is below material"
    return "unresolved", f"{where}: the interval straddles the threshold"


def _combine(states: list[str]) -> str:
    if "limited" in states:
        return "limited"
    fitted = [s for s in states if s != "insufficient"]
    if fitted and all(s == "flat" for s in fitted):
        return "flat"
    return "unresolved" if fitted else "insufficient"


def _comparison_finding(c: Comparison, m: float, th: Thresholds) -> Finding | None:
    at = f"at N={c.n:.3g}"
    if c.category == "features":
        e, text = c.best_vs_worst, f"{c.key}={c.best} beats {c.key}={c.worst} on {c.metric} by"
    else:
        if c.best == c.baseline:
            return None
        e, text = c.best_vs_baseline, f"{c.key}={c.best} beats the baseline {c.key}={c.baseline} on {c.metric} by"
    if not _resolved(e, m, th):
        return None
    advice = ""
    if c.category == "features":
        advice = (f": the feature choice matters, keep {c.key}={c.best} and try other or more layers"
                  if c.best == c.baseline else f": switch to {c.key}={c.best}")
    return Finding(c.category, True, e.value / m, f"{text} {e.fmt()} {at} (material: {m:.3g}){advice}")


def decide(fits: dict[str, PowerLawFit], comparisons: list[Comparison], val_at_nmax: float,
           gap: Estimate | None, conv: tuple[str, float] | None, th: Thresholds = Thresholds()) -> Verdict:
    """Applies the rules in the module docstring. `fits` maps metric -> fit; `val_at_nmax` is the baseline
    validation loss at the largest N (the scale of the loss thresholds)."""
    evidence, states = [], []
    for metric, fit in fits.items():
        ref = fit.mean[-1] if len(fit.mean) else val_at_nmax
        state, text = data_state(fit, material(metric, ref, th), th)
        states.append(state)
        evidence.append(text)
    state = _combine(states)

    findings: list[Finding] = []
    for c in comparisons:
        ref = next((lv.mean for lv in c.levels if lv.baseline), val_at_nmax)
        f = _comparison_finding(c, material(c.metric, ref, th), th)
        if f is not None:
            findings.append(f)
        else:
            evidence.append(f"{c.key} on {c.metric} at N={c.n:.3g}: best {c.best}, vs baseline "
                            f"{c.baseline} {c.best_vs_baseline.fmt()}, best vs worst {c.best_vs_worst.fmt()}"
                            " (not resolved or not material)")
    if conv is not None:
        key, drop = conv
        text = f"{key} fell {drop:.1%} over the last {th.tail_fraction:.0%} of training at N_max"
        if drop > th.not_converged_rel_drop:
            findings.append(Finding("optimisation", False, drop / th.not_converged_rel_drop,
                                    f"{text}: training has not converged", confound=True))
        else:
            evidence.append(f"{text}: converged")
    if gap is not None and math.isfinite(val_at_nmax) and val_at_nmax:
        rel = gap.value / abs(val_at_nmax)
        text = f"train/val gap at N_max (val - train) = {gap.fmt()} ({rel:+.1%} of val loss)"
        if -rel > th.train_above_val_rel:
            findings.append(Finding("optimisation", False, -rel / th.train_above_val_rel,
                                    f"{text}: train loss above val loss, the optimiser has not fit the data"))
        elif state == "flat" and abs(rel) < th.small_gap_rel:
            findings.append(Finding("capacity", False, 1.0, f"{text}: no overfitting while more data does not "
                                    "help, so the draft cannot represent more (or its features carry no more)"))
        else:
            evidence.append(text)
    return _verdict(state, findings, evidence, fits, th)


def _verdict(state, findings, evidence, fits, th) -> Verdict:
    ranked = sorted(findings, key=lambda f: (f.confound, f.direct, f.effect), reverse=True)
    primary = next((f for f in ranked if f.category != "other"), None)
    gains = "; ".join(f"{m} {f.gain_per_doubling.fmt()}" for m, f in fits.items() if f.ok)
    if state == "limited":
        v = Verdict("data-limited", None, f"Data-limited: doubling the data is projected to help materially "
                    f"(gain per doubling at the largest N: {gains}). Get more data.", state, evidence, ranked)
        if any(f.confound for f in findings):
            v.next_steps.append("training had not converged at N_max: with fixed epochs more data also means "
                                "more optimiser steps, so rerun the largest N with more epochs to separate the two")
        v.next_steps += [f"also: {f.category} ({f.text})" for f in ranked if not f.confound]
        return v
    if primary is not None:
        why = {"limited": "", "flat": "more data is not helping materially",
               "unresolved": "the data curve is not resolved", "insufficient": "the data curve is not measured"}
        v = Verdict("bottleneck", primary.category, f"At a bottleneck: {primary.category}. {primary.text}; "
                    f"{why[state]}{' (' + gains + ')' if gains else ''}.", state, evidence, ranked)
        v.next_steps += [f"also: {f.category} ({f.text})" for f in ranked if f is not primary]
        return v
    if state == "flat":
        return Verdict("bottleneck", "unidentified", f"At a bottleneck, not identified: more data is not helping "
                       f"materially ({gains}) and no sweep isolates the cause.", state, evidence, ranked,
                       ["run the layer sweep (extract.layers auto vs last) and a capacity sweep "
                        "(draft.num_layers, draft.hidden_size) at the largest N"])
    nxt = []
    if state == "insufficient":
        nxt.append(f"run at least {th.min_points} data sizes (4+ spaced by doublings is better)")
    if any(f.ok and not f.gain_per_doubling.known for f in fits.values()) or state == "insufficient":
        nxt.append("add seeds (2-3 per data size) so noise can be measured")
    if state == "unresolved":
        nxt.append("add seeds or a larger data size: the gain per doubling interval straddles the threshold")
    return Verdict("undetermined", None, f"Undetermined: the sweep cannot tell "
                   f"({'too few data sizes' if state == 'insufficient' else 'the data curve is not resolved'}"
                   f"{'; ' + gains if gains else ''}).", state, evidence, ranked, nxt)
