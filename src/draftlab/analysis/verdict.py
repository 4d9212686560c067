"""The verdict: under-trained, data-limited, at a bottleneck (features, capacity, optimisation), or undetermined.
Every rule is below, with its threshold in `Thresholds`. The axes come from `axes.measure_axes`.

An axis gain g (the improvement of the next doubling of steps or data) with its bootstrap interval [lo, hi] is,
against a materiality threshold m (loss: `material_loss_rel` of the loss there; tau: `material_tau` absolute):
  - limited (helps):  g >= m and lo > `near_zero_fraction` * m (the interval excludes ~0, the gain is material)
  - flat:             hi < m (even the optimistic end of the interval is not worth a doubling)
  - unresolved:       otherwise, or no interval
A data axis fitted on enough sizes is also judged by each curve family (power law, log-quadratic: families.py):
flat only when every family says flat, and unresolved when one family says it helps and another says flat.
The verdict decides on one metric, in the user's currency (currency.py): deployed tau when the sweep benches,
else predicted tau; the loss (and any other metric) is evidence beside it, judged against a loss line worth the
tau line at the sweep's own loss-to-tau rate. Findings come from comparisons at equal cost (equal_cost.py).
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
  2b. joint: neither steps nor data alone clears the line, and doubling both together does (levers.py).
  3. undetermined (confound): nothing separates data from steps (a fixed-epoch sweep doubles both at once).
  4. bottleneck:<features|capacity|optimisation>: the direct finding with the largest effect (in units of m):
     two `extract.*` settings differ, a `draft.*` or `train.*` setting beats the baseline, at equal data and
     equal cost (GPU-seconds, else steps); a comparison against an unconverged baseline is unresolved.
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
from draftlab.analysis.compare import Contrast, as_trained
from draftlab.analysis.records import direction
from draftlab.analysis.stats import Estimate


@dataclass(frozen=True)
class Thresholds:
    material_loss_rel: float = 0.01  # a loss change worth having, when the sweep has no tau: 1% of the loss
    # the loss line in loss units: material_tau at the sweep's own loss-to-tau rate (currency.py); NaN: the share
    material_loss_abs: float = math.nan
    material_tau: float = 0.1  # a tau change worth having; EAGLE-3 gains 0.3-0.4 per doubling, EAGLE-2 ~0
    near_zero_fraction: float = 0.25  # "excludes ~0": the lower bound must clear this fraction of material
    min_points: int = 3  # distinct axis values needed for a power-law fit (fewer: two-point gain)
    small_gap_rel: float = 0.05  # |val - train| / val below this: no overfitting
    train_above_val_rel: float = 0.05  # train loss this far above val: the optimiser has not fit the data
    # Noise when no cell has replicate seeds: the seed-to-seed sd of SmolLM2's own sweep
    # (benchmarks/results/h200_data_scaling_jobs.jsonl, pooled over 6 sizes) is 1.4% of val/loss and 0.012 of tau;
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
    kind: str  # under-trained | data-limited | joint | bottleneck | undetermined
    bottleneck: str | None  # features | capacity | optimisation | unidentified (kind == bottleneck)
    headline: str
    data_state: str  # limited | flat | unresolved | insufficient (the data axis where training converged)
    evidence: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)
    steps_state: str = "insufficient"  # limited | flat | unresolved | insufficient
    joint_state: str = "insufficient"  # the same, for data and steps doubled together
    metric: str = ""  # the metric the verdict decides on
    unresolved: list[str] = field(default_factory=list)  # comparisons no finding can be called on, with why

    @property
    def tag(self) -> str:
        return f"bottleneck:{self.bottleneck}" if self.kind == "bottleneck" else self.kind

    @property
    def plain(self) -> str:
        if self.kind == "joint":
            return "limited by data and steps together"
        return f"at a bottleneck ({self.bottleneck})" if self.kind == "bottleneck" else self.kind


def material(metric: str, reference: float, th: Thresholds) -> float:
    if direction(metric) > 0:
        return th.material_tau
    return th.material_loss_abs if math.isfinite(th.material_loss_abs) else th.material_loss_rel * abs(reference)


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
    what = "steps" if axis.name.startswith("steps") else "data and steps" if axis.name == "joint" else "data"
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


def _comparison_finding(x, m: float, th: Thresholds) -> Finding | None:
    """A finding from an equal_cost.Contrast, read at its basis (equal GPU-seconds, else equal steps)."""
    c = x.comparison
    at = f"at N={c.n:.3g}, {x.basis}"
    if x.over == c.baseline:
        text = f"{c.key}={x.better} beats the baseline {c.key}={x.over} on {c.metric} by"
    else:
        text = f"{c.key}={x.better} beats {c.key}={x.over} on {c.metric} by"
    e = x.used
    if x.unresolved or not _resolved(e, m, th):
        return None
    if c.category == "features" and x.better == c.baseline:
        advice = f": the feature choice matters, keep {c.key}={x.better} and try other or more layers"
    elif c.category == "capacity":  # val loss and predicted tau do not see the larger draft's cost per step
        advice = f": a larger draft learns more here; serve {c.key}={x.better} with the bench stage to see if it pays"
    else:
        advice = f": switch to {c.key}={x.better}"
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


def decide(axes: dict[str, Axes], comparisons: list, val_at_nmax: float, gap: Estimate | None,
           th: Thresholds = Thresholds(), mixed_code: str = "", primary: str | None = None,
           joints: dict[str, Axis | None] | None = None) -> Verdict:
    """Applies the rules in the module docstring. `axes` maps metric -> both axes of the baseline config;
    `comparisons` are compare.Contrast at equal cost (a bare Comparison is read as trained); `primary` is the
    metric the verdict decides on (default: the first), the others are evidence; `joints` maps metric -> the
    joint lever's axis; `val_at_nmax` is the baseline validation loss at the largest N; `mixed_code` names the
    runs whose code differs (rule 0), '' when they share it or mixing is allowed."""
    primary = primary or next(iter(axes), "")
    joints = joints or {}
    evidence, confounds = [], []
    steps_state = state = joint_state = "insufficient"
    for metric, ax in axes.items():
        main = metric == primary
        beside = "" if main else "beside the verdict: "
        steps = axis_state(ax.steps, th) if ax.steps is not None else ("insufficient", "")
        if steps[1]:
            evidence.append(beside + steps[1])
        if ax.capped and main:
            evidence.append("still improving at the step cap (early stopping never fired), so under-trained there "
                            "and left out of the converged data axis: N=" + ", ".join(f"{n:.4g}" for n in ax.capped))
        joint = axis_state(joints[metric], th) if joints.get(metric) is not None else ("insufficient", "")
        if joint[1]:
            evidence.append(beside + joint[1])
        alone = joints[metric].alone if joints.get(metric) is not None else None
        if alone is not None:
            said = axis_state(alone, th)
            evidence.append(f"{beside}{said[1]} (data alone over the joint lever's sizes)")
            if said[0] == "limited" and joint[0] == "limited":  # data alone clears the line there: no news
                joint = ("with-data", joint[1])
        data = ("insufficient", "")
        if ax.data is None:
            if ax.confound and main:
                confounds.append(ax.confound)
        else:
            data = axis_state(ax.data, th)
            # data at a step budget only counts once more steps there stop helping
            if ax.data_at_convergence is None and steps[0] != "flat":
                data = "unresolved", data[1] + " (not at convergence: the steps axis there is not flat)"
            elif ax.data.fit is None or not ax.data.fit.ok:  # buying data is dear: the next doubling needs a curve
                data = "insufficient", (f"{data[1]}; but {len(ax.data.x)} data sizes only measure the last "
                                        f"doubling: the next needs {th.min_points} for a curve")
            evidence.append(beside + data[1])
        if main:
            steps_state, state, joint_state = steps[0], data[0], joint[0]
    spent = _steps_spent(axes, steps_state, th, evidence)

    findings: list[Finding] = []
    unresolved: list[str] = []
    for x in comparisons:
        x = x if isinstance(x, Contrast) else as_trained(x)
        if x is None:
            continue
        c = x.comparison
        ref = next((lv.mean for lv in c.levels if lv.baseline), val_at_nmax)
        f = _comparison_finding(x, material(c.metric, ref, th), th)
        said = (f"{c.key}={x.better} over {x.over} on {c.metric} at N={c.n:.3g}: as trained {x.as_trained.fmt()}"
                + (f", equal steps {x.equal_steps.fmt()}" if x.equal_steps is not None else "")
                + (f", equal GPU-seconds {x.equal_seconds.fmt()}" if x.equal_seconds is not None else ""))
        if c.metric != primary:
            evidence.append(f"beside the verdict: {said}" + (f" (unresolved: {x.unresolved})" if x.unresolved else ""))
        elif x.unresolved:
            unresolved.append(f"[{c.category}] {said}: unresolved, {x.unresolved}")
        elif f is not None:
            findings.append(f)
        else:
            evidence.append(f"{said}: at {x.basis}, not resolved or not material")
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
    main_axes = {primary: axes[primary]} if primary in axes else axes
    if mixed_code:  # what would have been a finding stays evidence: no difference across code is resolved
        evidence += [f"{f.text} (not called resolved: mixed code)" for f in findings]
        v = Verdict("undetermined", None, f"Undetermined: {mixed_code}. No difference between runs on other "
                    "code is called resolved (--allow-mixed-code overrides).", state, evidence, [],
                    ["rerun the differing runs on one code version (or pass --allow-mixed-code, knowingly)"],
                    steps_state)
    else:
        v = _verdict(state, steps_state, findings, evidence, main_axes, confounds, th, spent, joint_state,
                     joints.get(primary))
    v.steps_state, v.joint_state, v.metric, v.unresolved = steps_state, joint_state, primary, unresolved
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


def _verdict(state, steps_state, findings, evidence, axes, confounds, th, spent=True, joint_state="insufficient",
             joint: Axis | None = None) -> Verdict:
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
    # only where each alone was measured and did not clear the line: a fixed-epoch sweep doubles both blindly
    if joint_state == "limited" and joint is not None and {steps_state, state} <= {"flat", "unresolved"}:
        v = Verdict("joint", None, f"Limited by data and steps together: neither alone clears the line, doubling "
                    f"both does ({joint.metric} {joint.gain.fmt()}, {joint.held}). Buy data and train it longer.",
                    state, evidence, ranked)
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
