"""The verdict: under-trained, data-limited, at a bottleneck (features, capacity, optimisation), or undetermined.
Every rule is below, with its threshold in `Thresholds`. The axes come from `axes.measure_axes`.

An axis gain g (the improvement of the next doubling of steps or data) with its bootstrap interval [lo, hi] is,
against a materiality threshold m (loss: `material_loss_rel` of the loss there; tau: `material_tau` absolute):
  - limited (helps):  g >= m and lo > `near_zero_fraction` * m (the interval excludes ~0, the gain is material)
  - flat:             hi < m (even the optimistic end of the interval is not worth a doubling)
  - unresolved:       otherwise, or no interval
A data axis fitted on enough sizes is also judged by each curve family (power law, log-quadratic: families.py):
flat only when every family says flat, and unresolved when one family says it helps and another says flat.
Rules, first match wins (other findings are listed as "also"):
  0. undetermined (mixed code): the runs ran on more than one version of the train or extract code, and the
     user did not pass --allow-mixed-code: no difference between them is called resolved.
  1. under-trained: the steps axis helps for some metric: more steps on the same data help materially (a step
     budget grid, or the steps probe `train.extend_steps` of converged runs). It comes first because it
     confounds every other comparison, and it costs no new data.
  2. data-limited: the data axis helps, measured where training has converged (among runs whose early stopping
     fired, or at a step budget where the steps axis is flat) and fitted on `min_points` data sizes: data is
     dear, so the next doubling is projected from a curve, not read off the last one. (The steps axis may rest
     on two points: its last doubling costs no new data.)
  3. undetermined (confound): nothing separates data from steps (a fixed-epoch sweep doubles both at once).
  4. bottleneck:<features|capacity|optimisation>: the direct finding with the largest effect (in units of m):
     two `extract.*` settings differ, a `draft.*` or `train.*` setting beats the baseline, at equal data.
  5. bottleneck (indirect): the converged data axis is flat and |val - train| < `small_gap_rel` of val
     (capacity: no overfitting, yet more data does not help), or train loss above val by > `train_above_val_rel`
     (optimisation); flat with nothing isolating the cause is `bottleneck:unidentified`. Capacity needs the
     steps to be spent too: not when the val/loss slope left at the plateau (`train/final_slope`) would still
     buy a material loss over a doubling of steps, nor when a steps axis is unresolved.
  6. undetermined, with what to run next.
Convergence is read from the steps axis itself or from the early-stopping record (`train/stopped_early`), so
it holds under any schedule (a cosine that ends at zero flattens every curve at its end, converged or not). A
size whose early-stopping runs all reached `train.max_steps` was still improving: it is named, and left off the
converged data axis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from draftlab.analysis.axes import Axes, Axis
from draftlab.analysis.compare import Comparison
from draftlab.analysis.records import direction
from draftlab.analysis.stats import Estimate


@dataclass(frozen=True)
class Thresholds:
    material_loss_rel: float = 0.01  # a loss change worth having: 1% of the loss at N_max (0.06 at 6.13)
    material_tau: float = 0.1  # a tau change worth having; EAGLE-3 gains 0.3-0.4 per doubling, EAGLE-2 ~0
    near_zero_fraction: float = 0.25  # "excludes ~0": the lower bound must clear this fraction of material
    min_points: int = 3  # distinct axis values needed for a power-law fit (fewer: two-point gain)
    small_gap_rel: float = 0.05  # |val - train| / val below this: no overfitting
    train_above_val_rel: float = 0.05  # train loss this far above val: the optimiser has not fit the data
    # Noise when no cell has replicate seeds: the seed-to-seed sd of SmolLM2's own sweep
    # (bench/results/h200_data_scaling_jobs.jsonl, pooled over 6 sizes) is 1.4% of val/loss and 0.012 of tau;
    # the assumed values are above it, so an unreplicated sweep gets wider, not narrower, intervals.
    assumed_noise_rel: float = 0.02
    assumed_noise_tau: float = 0.05


@dataclass
class Finding:
    category: str  # features | capacity | optimisation | other
    direct: bool  # from a controlled comparison (True) or a heuristic (False)
    effect: float  # size in units of the materiality threshold, for ranking
    text: str
    confound: bool = False  # non-converged training: rank first


@dataclass
class Verdict:
    kind: str  # under-trained | data-limited | bottleneck | undetermined
    bottleneck: str | None  # features | capacity | optimisation | unidentified (kind == bottleneck)
    headline: str
    data_state: str  # limited | flat | unresolved | insufficient (the data axis where training converged)
    evidence: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)
    steps_state: str = "insufficient"  # limited | flat | unresolved | insufficient

    @property
    def tag(self) -> str:
        return f"bottleneck:{self.bottleneck}" if self.kind == "bottleneck" else self.kind

    @property
    def plain(self) -> str:
        return f"at a bottleneck ({self.bottleneck})" if self.kind == "bottleneck" else self.kind


def material(metric: str, reference: float, th: Thresholds) -> float:
    return th.material_tau if direction(metric) > 0 else th.material_loss_rel * abs(reference)


def _resolved(e: Estimate, m: float, th: Thresholds) -> bool:
    return e.known and e.value >= m and e.lo > th.near_zero_fraction * m


def _gain_state(g: Estimate, m: float, th: Thresholds) -> str:
    if not g.known:
        return "unknown"
    return "limited" if _resolved(g, m, th) else "flat" if g.hi < m else "unresolved"


def axis_state(axis: Axis, th: Thresholds) -> tuple[str, str]:
    """(limited | flat | unresolved, sentence) for one axis of one metric."""
    m = material(axis.metric, axis.mean[-1], th)
    g = axis.gain
    what = "steps" if axis.name.startswith("steps") else "data"
    where = (f"{axis.metric}: next doubling of {what} ({axis.held}, from {axis.x_max:.4g}) gains {g.fmt()} "
             f"(material: {m:.3g})")
    state = _gain_state(g, m, th)
    families = axis.fit.families if what == "data" and axis.fit is not None and axis.fit.ok else []
    if len(families) > 1:
        states = {f.name: _gain_state(f.gain, m, th) for f in families}
        said = "; ".join(f"{f.name} {f.gain.fmt()}" for f in families)
        where += f" (families: {said}; spread {axis.fit.gain_spread:.3g})"
        if {"limited", "flat"} <= set(states.values()):
            return "unresolved", f"{where}: the curve families disagree (one says it helps, one says flat)"
        if state == "flat" and set(states.values()) != {"flat"}:
            return "unresolved", f"{where}: flat by the power law only, not by every curve family"
    if state == "unknown":
        return "unresolved", f"{where}: no interval"
    if state == "limited":
        return "limited", f"{where}: more {what} clearly helps"
    if state == "flat":
        return "flat", f"{where}: even the upper bound is below material"
    return "unresolved", f"{where}: the interval straddles the threshold"


def _combine(states: list[str]) -> str:
    if "limited" in states:
        return "limited"
    fitted = [s for s in states if s != "insufficient"]
    if fitted and all(s == "flat" for s in fitted):
        return "flat"
    return "unresolved" if fitted else "insufficient"


def _per_second(axis: Axis) -> str:
    if not math.isfinite(axis.seconds) or axis.seconds <= 0:
        return "price unknown (no measured stage seconds)"
    per_ks = 1000.0 * axis.gain.value / axis.seconds
    return f"about {axis.seconds:,.0f} s of measured stage time ({per_ks:+.3g} per 1000 s)"


def pricing(axes: Axes) -> str:
    """'2x steps: +g [lo, hi], about X s of stage time; 2x data: ...' for one metric; '' when neither is measured."""
    parts = []
    if axes.steps is not None:
        parts.append(f"2x steps (at {axes.steps.held}): {axes.metric} {axes.steps.gain.fmt()}, "
                     f"{_per_second(axes.steps)}")
    if axes.data is not None:
        parts.append(f"2x data ({axes.data.held}): {axes.metric} {axes.data.gain.fmt()}, "
                     f"{_per_second(axes.data)}, generation + extraction + training")
    return "; ".join(parts)


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
    if c.category == "features" and c.best == c.baseline:
        advice = f": the feature choice matters, keep {c.key}={c.best} and try other or more layers"
    elif c.category == "capacity":  # val loss and predicted tau do not see the larger draft's cost per step
        advice = f": a larger draft learns more here; serve {c.key}={c.best} with the bench stage to see if it pays"
    else:
        advice = f": switch to {c.key}={c.best}"
    return Finding(c.category, True, e.value / m, f"{text} {e.fmt()} {at} (material: {m:.3g}){advice}")


def _steps_spent(axes: dict[str, Axes], steps_state: str, th: Thresholds, evidence: list[str]) -> bool:
    """False when something says more steps might still help: a steps axis that is not flat, or (with no steps
    axis measured) a material loss left in the slope at the plateau (its interval's lower end above near-zero).
    A measured steps axis (a budget grid, the steps probe) outranks the slope, which only extrapolates."""
    if steps_state != "insufficient":
        return steps_state == "flat"
    first = next(iter(axes.values()), None)
    r = first.remaining if first is not None else None
    if r is None or not r.known:
        return True
    m = material(first.metric, first.data.mean[-1] if first.data is not None else math.nan, th)
    text = (f"at N={first.remaining_at:.4g} val/loss was still falling when early stopping fired: at that slope "
            f"a doubling of steps would buy up to {r.fmt()} (material: {m:.3g})")
    if _resolved(r, m, th):
        evidence.append(text + ": not converged in the sense that matters; a steps probe (train.extend_steps) "
                        "would say how much")
        return False
    evidence.append(text.replace("was still falling", "had flattened"))
    return True


def decide(axes: dict[str, Axes], comparisons: list[Comparison], val_at_nmax: float,
           gap: Estimate | None, th: Thresholds = Thresholds(), mixed_code: str = "") -> Verdict:
    """Applies the rules in the module docstring. `axes` maps metric -> both axes of the baseline config;
    `val_at_nmax` is the baseline validation loss at the largest N (the scale of the loss thresholds);
    `mixed_code` names the runs whose code differs (rule 0), '' when they share it or mixing is allowed."""
    evidence, steps_states, data_states, confounds = [], [], [], []
    for ax in axes.values():
        steps = axis_state(ax.steps, th) if ax.steps is not None else ("insufficient", "")
        steps_states.append(steps[0])
        if steps[1]:
            evidence.append(steps[1])
        if ax.capped and ax is next(iter(axes.values())):
            evidence.append("still improving at the step cap (early stopping never fired), so under-trained there "
                            "and left out of the converged data axis: N=" + ", ".join(f"{n:.4g}" for n in ax.capped))
        if ax.data is None:
            data_states.append("insufficient")
            if ax.confound:
                confounds.append(ax.confound)
            continue
        state, text = axis_state(ax.data, th)
        # data at a step budget only counts once more steps there stop helping
        trusted = ax.data_at_convergence is not None or steps[0] == "flat"
        if not trusted:
            state, text = "unresolved", text + " (not at convergence: the steps axis there is not flat)"
        elif ax.data.fit is None or not ax.data.fit.ok:  # buying data is dear: the next doubling needs a curve
            state, text = "insufficient", (f"{text}; but {len(ax.data.x)} data sizes only measure the last "
                                           f"doubling: the next needs {th.min_points} for a curve")
        evidence.append(text)
        data_states.append(state)
    steps_state, state = _combine(steps_states), _combine(data_states)
    spent = _steps_spent(axes, steps_state, th, evidence)

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
    if gap is not None and math.isfinite(val_at_nmax) and val_at_nmax:
        rel = gap.value / abs(val_at_nmax)
        text = f"train/val gap at N_max (val - train) = {gap.fmt()} ({rel:+.1%} of val loss)"
        if -rel > th.train_above_val_rel:
            findings.append(Finding("optimisation", False, -rel / th.train_above_val_rel,
                                    f"{text}: train loss above val loss, the optimiser has not fit the data"))
        elif state == "flat" and abs(rel) < th.small_gap_rel and spent:
            findings.append(Finding("capacity", False, 1.0, f"{text}: no overfitting while more data does not "
                                    "help, so the draft cannot represent more (or its features carry no more)"))
        else:
            evidence.append(text)
    prices = [p for p in (pricing(a) for a in list(axes.values())[:2]) if p]  # the loss and the first tau
    if mixed_code:  # what would have been a finding stays evidence: no difference across code is resolved
        evidence += [f"{f.text} (not called resolved: mixed code)" for f in findings]
        return Verdict("undetermined", None, f"Undetermined: {mixed_code}. No difference between runs on other "
                       "code is called resolved (--allow-mixed-code overrides).", state, evidence, [],
                       ["rerun the differing runs on one code version (or pass --allow-mixed-code, knowingly)"],
                       steps_state)
    v = _verdict(state, steps_state, findings, evidence, axes, confounds, th, spent)
    v.steps_state = steps_state
    if prices:
        v.headline += " Next doubling: " + " | ".join(prices) + "."
    return v


def _cap_advice(axes: dict[str, Axes]) -> list[str]:
    capped = next(iter(axes.values())).capped if axes else []
    return [f"raise train.max_steps for N={', '.join(f'{n:.4g}' for n in capped)}: those runs hit the cap still "
            "improving, so the data axis at convergence does not reach them yet"] if capped else []


def _gains(axes: dict[str, Axes], which: str) -> str:
    out = []
    for ax in axes.values():
        axis = getattr(ax, which)
        if axis is not None:
            out.append(f"{ax.metric} {axis.gain.fmt()} ({axis.held})")
    return "; ".join(out)


def _verdict(state, steps_state, findings, evidence, axes, confounds, th, spent=True) -> Verdict:
    ranked = sorted(findings, key=lambda f: (f.direct, f.effect), reverse=True)
    primary = next((f for f in ranked if f.category != "other"), None)
    also = [f"also: {f.category} ({f.text})" for f in ranked]
    if steps_state == "limited":
        v = Verdict("under-trained", None, f"Under-trained: more optimizer steps on the same data help "
                    f"materially (next doubling of steps: {_gains(axes, 'steps')}). Train longer before "
                    "buying data.", state, evidence, ranked)
        v.next_steps = ["train to convergence: train.early_stop_patience with a train.max_steps cap "
                        "(experiment=data_scaling does this), or a larger train.max_steps"] + also
        if any(a.data is not None for a in axes.values()):
            v.next_steps.append(f"the data axis was measured short of convergence: {_gains(axes, 'data')}")
        return v
    if state == "limited":
        v = Verdict("data-limited", None, f"Data-limited: at convergence, doubling the data helps materially "
                    f"({_gains(axes, 'data')}). Get more data.", state, evidence, ranked)
        v.next_steps = also + _cap_advice(axes)
        return v
    if confounds and state == "insufficient":
        return Verdict("undetermined", None, f"Undetermined: {confounds[0]}.", state, evidence, ranked,
                       ["run experiment=steps_vs_data (data sizes x step budgets), or experiment=data_scaling "
                        "(each N trained to convergence)"] + also)
    if primary is not None:
        why = {"flat": "more data is not helping materially", "unresolved": "the data curve is not resolved",
               "insufficient": "the data curve at convergence has too few sizes"}
        v = Verdict("bottleneck", primary.category, f"At a bottleneck: {primary.category}. {primary.text}; "
                    f"{why[state]}.", state, evidence, ranked)
        v.next_steps += [f"also: {f.category} ({f.text})" for f in ranked if f is not primary]
        return v
    if state == "flat" and spent:
        return Verdict("bottleneck", "unidentified", f"At a bottleneck, not identified: at convergence more data "
                       f"is not helping materially ({_gains(axes, 'data')}) and no sweep isolates the cause.",
                       state, evidence, ranked,
                       ["run the layer sweep (extract.layers auto vs last) and a capacity sweep "
                        "(draft.num_layers, draft.hidden_size) at the largest N"])
    nxt = _cap_advice(axes)
    if not spent:
        nxt.append("run the steps probe at the largest sizes (train.extend_steps: on from the plateau at constant "
                   "lr, then the decay): the slope left at the plateau says steps may still pay")
    if state == "insufficient":
        nxt.append(f"run at least {th.min_points} data sizes, spaced by doublings, each trained to convergence")
    if any(a.noise_source == "assumed" for a in axes.values()):
        nxt.append("add seeds (2-3 per cell) so noise can be measured rather than assumed")
    if "unresolved" in (state, steps_state):
        nxt.append("add seeds or a larger data size / step budget: an interval straddles the threshold")
    why = "the data axis at convergence has too few sizes" if state == "insufficient" else "nothing is resolved"
    return Verdict("undetermined", None, f"Undetermined: the sweep cannot tell ({why}; steps: "
                   f"{_gains(axes, 'steps') or 'not measured'}; data: {_gains(axes, 'data') or 'not measured'}).",
                   state, evidence, ranked, nxt)
