"""The Markdown report of a sweep analysis: the answer first, then the tables behind it. No line is longer
than `WIDTH` characters: prose is wrapped, tables are cut into columns that fit."""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from draftlab.analysis.axes import Axes
from draftlab.analysis.compare import Comparison
from draftlab.analysis.fit import PowerLawFit
from draftlab.analysis.levers import Lever, fmt_seconds
from draftlab.analysis.records import Run, by_group, label, values
from draftlab.analysis.stats import Estimate
from draftlab.analysis.valnoise import ValNoise
from draftlab.analysis.verdict import Thresholds, Verdict
from draftlab.plan.stage_keys import read_by

WIDTH = 120


@dataclass
class Extras:
    """What the report says beyond the fits: the answer paragraph, the comparisons at equal cost, the joint
    lever per metric, the levers' prices and the loss line's exchange rate."""

    answer: str = ""
    contrasts: list = field(default_factory=list)
    joints: dict = field(default_factory=dict)
    levers: list = field(default_factory=list)
    currency: str = ""


def wrap(lines: list[str]) -> list[str]:
    """Prose and list items wrapped at WIDTH (list items indented under their dash); tables and images kept."""
    out = []
    for line in lines:
        if len(line) <= WIDTH or line.startswith(("|", "![")):
            out.append(line)
            continue
        indent = "  " if line.startswith("- ") else ""
        out += textwrap.wrap(line, WIDTH, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)
    return out


COLUMNS = ("val/loss", "train/loss", "bench/tau", "val/predicted_tau", "val/acc_0", "train/steps",
           "train/stopped_early")


def _cell(v: np.ndarray) -> str:
    if v.size == 0:
        return ""
    return f"{v.mean():.4g}" + (f" ± {v.std(ddof=1):.2g}" if v.size > 1 else "")


HEADERS = {"best/val_loss": "val loss (best)", "val/loss": "val loss", "train/loss": "train loss",
           "bench/tau": "tau", "val/predicted_tau": "predicted tau", "val/acc_0": "acc_0", "train/steps": "steps",
           "train/stopped_early": "stopped early"}


def _data_table(runs: list[Run], loss_key: str) -> list[str]:
    """One row per data size; `data.samples` beside N, which counts tokens when the records have them."""
    cols = [loss_key] + [c for c in COLUMNS[1:] if any(c in r.metrics for r in runs)]
    lines = ["| N | samples | runs | " + " | ".join(HEADERS.get(c, c) for c in cols) + " |",
             "|---" * (len(cols) + 3) + "|"]
    for n, group in by_group(runs):
        samples = ", ".join(sorted({label(r.params.get("data.samples", "?")) for r in group}))
        lines.append(f"| {n:.4g} | {samples} | {len(group)} | "
                     + " | ".join(_cell(values(group, c)) for c in cols) + " |")
    return lines


def _families_table(fit: PowerLawFit) -> list[str]:
    """Each curve family's gain, 2x projection and ceiling side by side, with the spread between them."""
    if len(fit.families) < 2:
        return []
    limit = "floor" if fit.sign > 0 else "ceiling"  # a loss falls to a floor, tau rises to a ceiling
    out = ["", f"| curve family | gain per doubling at N_max | projected at 2x N_max | {limit} (N -> inf) |",
           "|---|---|---|---|"]
    out += [f"| {f.name} | {f.gain.fmt()} | {f.at_2x.fmt()} | {f.ceiling.fmt()} |" for f in fit.families]
    out.append(f"| spread between families | {fit.gain_spread:.3g} | {fit.at_2x_spread:.3g} | |")
    return out


def _fit_section(fit: PowerLawFit, level: float) -> list[str]:
    shape = "L(N) = L_inf + A (N/N_max)^-alpha" if fit.sign > 0 else "tau(N) = tau_inf - A (N/N_max)^-alpha"
    out = [f"### {fit.metric}", ""]
    if not fit.ok:
        return out + [f"No fit: {fit.note}. Local gain per doubling between the two largest N: "
                      f"{fit.local_gain.fmt()}.", ""]
    p = fit.params
    limit = "floor" if fit.sign > 0 else "ceiling"
    spread = f" (spread between curve families: {fit.gain_spread:.3g})" if len(fit.families) > 1 else ""
    spread_2x = f" (spread: {fit.at_2x_spread:.3g})" if len(fit.families) > 1 else ""
    out += [f"Fit `{shape}` on {len(fit.n)} data sizes ({int(fit.counts.sum())} runs); seed noise sigma "
            f"{fit.sigma:.3g} from {fit.sigma_source} (df {fit.sigma_df}); intervals are {level:.0%} "
            "parametric-bootstrap intervals" + (", validation-sample noise included." if fit.val_noise else
                                                 ", validation-sample noise NOT included."), "",
            "| quantity | value [interval] |", "|---|---|",
            f"| A (part still reducible at N_max) | {p['A_at_nmax'].fmt()} |",
            f"| alpha | {p['alpha'].fmt()} |",
            f"| fitted at N_max = {fit.n_max:.4g} | {fit.fitted_nmax.fmt()} |",
            f"| **gain per doubling at N_max** | **{fit.gain_per_doubling.fmt()}**{spread} |",
            f"| local gain per doubling (two largest N, no curve) | {fit.local_gain.fmt()} |",
            f"| projected at 2x N_max (the furthest projected) | {fit.projections['2x'].fmt()}{spread_2x} |",
            f"| {limit} (the families' mean, the union of their intervals) | "
            f"{fit.ceiling.fmt() if fit.ceiling is not None else 'none stated'} |"]
    out += _families_table(fit)
    out += ["", f"{limit.capitalize()}: {fit.ceiling_note}."]
    if fit.note:
        out += ["", f"Note: {fit.note}."]
    return out + [""]


def tau_during_training(runs: list[Run]) -> tuple[str, list[str]]:
    """(a sentence, a table) on whether deployed tau (train.bench_every) peaked before val/loss's minimum, from
    the runs' `train/tau_peaked_first` (train/tau_curve.py); ('', []) when no run benched while it trained."""
    watched = [r for r in runs if math.isfinite(r.value("train/tau_peaked_first"))]
    if not watched:
        return "", []
    first = [r for r in watched if r.value("train/tau_peaked_first") == 1.0]
    drop = min(r.value("train/bench_tau_after_peak") for r in watched)
    sentence = (f"Deployed tau during training (train.bench_every) peaked before the val/loss minimum in "
                f"{len(first)} of {len(watched)} runs; the largest fall after the peak, by the last bench: "
                f"{-drop:.1%}.")
    table = ["| N | seed | tau peak | at step | val/loss minimum at step | tau first | last bench vs peak |",
             "|---|---|---|---|---|---|---|"]
    for r in sorted(watched, key=lambda r: (r.n, str(r.params.get("train.seed")))):
        table.append(f"| {r.n:.4g} | {r.params.get('train.seed')} | {r.value('train/bench_tau_peak'):.3g} | "
                     f"{r.value('train/bench_tau_peak_step'):.0f} | {r.value('train/val_loss_min_step'):.0f} | "
                     f"{'yes' if r in first else 'no'} | {r.value('train/bench_tau_after_peak'):+.1%} |")
    return sentence, table


def _comparison_section(comparisons: list[Comparison], contrasts: list) -> list[str]:
    if not comparisons:
        return ["No factor was varied at equal data (no layer, capacity or epoch comparison).", ""]
    out = ["| factor | metric | N | setting | mean | sd | runs |", "|---|---|---|---|---|---|---|"]
    for c in comparisons:
        for lv in c.levels:
            name = f"**{lv.label}**" if lv.baseline else lv.label
            out.append(f"| {c.key} ({c.category}) | {c.metric} | {c.n:.4g} | {name} | {lv.mean:.4g} | {lv.sd:.2g} | "
                       f"{lv.count} |")
    out += ["", "The baseline is in bold. Each contrast below is the better setting's improvement (> 0 = better: "
            "lower loss, higher tau) as trained, and with the baseline moved along its own steps axis to the other "
            "setting's steps and to its training GPU-seconds (`analysis/equal_cost.py`). The verdict reads equal "
            "GPU-seconds where both cells record their training seconds, else equal steps.", ""]
    for metric in dict.fromkeys(x.comparison.metric for x in contrasts):
        out += [f"{metric}:", "", "| factor | contrast | as trained | equal steps | equal GPU-seconds |",
                "|---|---|---|---|---|"]
        for x in (x for x in contrasts if x.comparison.metric == metric):
            cells = [e.fmt() if e is not None else "n/a" for e in (x.as_trained, x.equal_steps, x.equal_seconds)]
            out.append(f"| {x.comparison.key} | {x.better} over {x.over} | " + " | ".join(cells) + " |")
        out += [""] + [f"- {x.comparison.key}: unresolved, {x.unresolved}." for x in contrasts
                       if x.comparison.metric == metric and x.unresolved]
        out += [""] if out[-1] else []
    return out


def _axes_section(axes: dict[str, Axes], level: float, th: Thresholds, joints: dict | None = None) -> list[str]:
    from draftlab.analysis.verdict import material

    out = ["## Steps and data", "",
           "Each lever with the rest held fixed; the gain is the improvement of a doubling (> 0 = better), "
           f"{level:.0%} bootstrap interval: the next doubling on a fitted axis, the last measured one on two points. "
           "GPU-seconds are what the doubling adds, from the runs' measured stage seconds; the price per line is "
           "GPU-seconds over the gain in lines.", "",
           "| metric | lever | doubling gains | GPU-s | s per line | line | fit |", "|---|---|---|---|---|---|---|"]
    held = []
    for ax in axes.values():
        joint = (joints or {}).get(ax.metric)
        for axis in (ax.steps, ax.data_at_steps, ax.data_at_convergence, joint):
            if axis is None:
                continue
            m = material(ax.metric, axis.mean[-1], th)
            price = f"{axis.seconds:,.0f}" if math.isfinite(axis.seconds) else "unknown"
            per = Lever(axis.name, "", axis.gain, axis.seconds).per_line(m)
            per_s = fmt_seconds(per) if math.isfinite(per.value) else "n/a"
            fit = "power law" if axis.fit is not None and axis.fit.ok else "two points"
            out.append(f"| {ax.metric} | {axis.name} | {axis.gain.fmt()} | {price} | {per_s} | {m:.3g} | {fit} |")
            pts = ", ".join(f"{x:.4g}: {v:.4g}" for x, v in zip(axis.x, axis.mean))
            held.append(f"- {ax.metric}, {axis.name}: {axis.held}; points (x: mean) {pts}.")
    out += [""] + held
    first = next(iter(axes.values()), None)
    if first is not None:
        out += ["", f"Noise: sd {first.sigma:.3g} of {first.metric} ({first.noise_source}"
                + (", no cell has replicate seeds" if first.noise_source == "assumed" else f", df {first.df}") + ")."]
        if first.costs:
            out += ["Measured costs: " + ", ".join(f"{k} {v:.3g}" for k, v in first.costs.items()) + "."]
        if first.confound:
            out += ["", f"**{first.confound}.**"]
    return out + [""]


def render(verdict: Verdict, fits: dict[str, PowerLawFit], comparisons: list[Comparison], runs: list[Run],
           base_runs: list[Run], baseline: tuple, loss_key: str, n_source: str, gap: Estimate | None,
           plots: dict[str, Path], th: Thresholds, level: float,
           others: dict[str, PowerLawFit] | None = None, axes: dict[str, Axes] | None = None,
           vnoise: ValNoise | None = None, links: str = "", command: str = "", left_out: list[str] = (),
           extras: Extras | None = None) -> str:
    """The report; `links` prefixes the plots' relative links, `command` is said to have generated it, `left_out`
    names the records without a validation loss; `extras` holds the answer and the comparisons at equal cost."""
    extras = extras or Extras()
    lines = ["# Sweep analysis: under-trained, data-limited or at a bottleneck?", ""]
    if extras.answer:
        lines += [extras.answer, ""]
    if command:
        lines += [f"Generated by `{command}` from {len(runs)} run records; regenerate it, do not edit it.", ""]
    lines += [f"**Verdict: {verdict.plain}** (`{verdict.tag}`). {verdict.headline}", ""]
    if extras.currency:
        lines += [f"Decided on {verdict.metric}; loss is evidence beside it. {extras.currency}", ""]
    if vnoise is not None:
        lines += [f"Intervals: {vnoise.describe()}.", ""]
    if verdict.findings:
        lines += ["Findings (resolved at the thresholds below):", ""]
        lines += [f"- [{f.category}{'' if f.direct else ', heuristic'}] {f.text}" for f in verdict.findings] + [""]
    if verdict.unresolved:
        lines += ["Unresolved (no finding can be called):", ""] + [f"- {u}" for u in verdict.unresolved] + [""]
    lines += ["Evidence:", ""] + [f"- {e}" for e in verdict.evidence] + [""]
    if verdict.next_steps:
        lines += ["Next:", ""] + [f"- {s}" for s in verdict.next_steps] + [""]
    ran = sorted({tag.split(".", 1)[1] for r in runs for tag in r.tags if tag.startswith("code.")})
    shown = [(k, v) for k, v in baseline if not ran or read_by(k, ran)]  # not the settings of stages never run
    of = f"; the settings read by the stages that ran: {', '.join(ran)}" if ran else ""
    skipped = (f" ({len(left_out)} record(s) without a validation loss left out: {', '.join(left_out)})"
               if left_out else "")
    lines += ["## Data", "", f"{len(runs)} runs{skipped}; N from `{n_source}`; the data-scaling series is the baseline "
              f"config ({len(base_runs)} runs{of}):", "",
              "`" + ", ".join(f"{k}={v}" for k, v in shown) + "`" if shown else "(no varied factors)", ""]
    lines += _data_table(base_runs, loss_key) + [""]
    lines += _axes_section(axes or {}, level, th, extras.joints)
    lines += ["## Data scaling (the series above: converged runs, else the largest step budget)", ""]
    for fit in fits.values():
        lines += _fit_section(fit, level)
    if gap is not None:
        lines += [f"Train/validation gap at N_max (val - train): {gap.fmt()}.", ""]
    if others:
        lines += ["Other configs swept over data (loss gain per doubling at their largest N):", "",
                  "| config (vs baseline) | N_max | gain per doubling | projected at 2x |", "|---|---|---|---|"]
        lines += [f"| {name} | {f.n_max:.4g} | {f.gain_per_doubling.fmt()} | {f.projections['2x'].fmt()} |"
                  for name, f in others.items() if f.ok] + [""]
    lines += ["## Comparisons at equal data and equal cost", ""] + _comparison_section(comparisons, extras.contrasts)
    sentence, table = tau_during_training(runs)
    if table:
        lines += ["## Deployed tau during training", "", sentence, ""] + table + [""]
    if plots:
        lines += ["## Plots", ""] + [f"![{name}]({links}{p.name})" for name, p in plots.items()] + [""]
    loss_line = (f"{th.material_loss_abs:.3g} loss (the tau line at the sweep's loss-to-tau rate)"
                 if math.isfinite(th.material_loss_abs) else f"{th.material_loss_rel:.0%} of the loss at N_max")
    lines += ["## Rules", "", f"The verdict decides on tau (deployed when the sweep benches, else predicted); loss "
              f"is evidence. Material change: {th.material_tau} tau; {loss_line}. Resolved: point >= material and "
              f"the {level:.0%} interval's lower bound > {th.near_zero_fraction} x material. Flat: upper bound < "
              "material; a data axis only when every curve family says so. Levers: 2x steps, 2x data, both together "
              "(joint); ablations at equal GPU-seconds (else equal steps), unresolved against an unconverged "
              "baseline. Converged: early stopping fired (train/stopped_early), or the steps axis is flat there. "
              "Projections stop at 2x the largest size; a ceiling needs 5 sizes spanning 16x, families whose "
              "intervals overlap and whose points lie within the material line, and a power law that misses its "
              "means by at most 3x the seed noise. The local gain's interval is model-free (seed and "
              "validation-sample noise). See `src/draftlab/analysis/verdict.py`, `levers.py`, `equal_cost.py` and "
              "`families.py`.", ""]
    return "\n".join(wrap(lines))
