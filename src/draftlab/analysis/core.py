"""analyze(records, out_dir): the whole sweep analysis, from job records to verdict, numbers, report and plots."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from draftlab.analysis import currency, equal_cost, plots
from draftlab.analysis.answer import answer
from draftlab.analysis.axes import Axes, Axis, measure_axes
from draftlab.analysis.codecheck import mixed_code
from draftlab.analysis.compare import Comparison, Contrast, compare_all, train_val_gap
from draftlab.analysis.currency import primary_metric, tau_per_loss, with_loss_line
from draftlab.analysis.fit import PowerLawFit, fit_power_law
from draftlab.analysis.records import (LOSS_KEYS, PREDICTED_TAU_KEY, TAU_KEY, baseline_config, by_group,
                                       direction, loss_key, metric_noise, normalise, step_clusters, values)
from draftlab.analysis.levers import Lever, equal_cost_run, joint_axis, levers
from draftlab.analysis.report import Extras, render, tau_during_training, wrap
from draftlab.analysis.valnoise import ValNoise, val_noise
from draftlab.analysis.verdict import Thresholds, Verdict, decide, material

SHORT = {TAU_KEY: "tau", PREDICTED_TAU_KEY: "predicted_tau"}  # analysis/* prefix; any loss metric is "loss"
VERDICT_CODES = {"undetermined": 0, "data-limited": 1, "bottleneck": 2, "under-trained": 3, "joint": 4}


@dataclass
class AnalysisResult:
    verdict: str  # under-trained | data-limited | joint | bottleneck | undetermined
    bottleneck: str | None  # features | capacity | optimisation | unidentified, when verdict == bottleneck
    headline: str  # the verdict in plain words
    evidence: list[str]
    next_steps: list[str]
    numbers: dict[str, float]  # flat `analysis/*` metrics, ready for MLflow
    report: str  # Markdown
    paths: dict[str, Path] = field(default_factory=dict)  # report + plots, when out_dir was given
    fits: dict[str, PowerLawFit] = field(default_factory=dict)  # the data-scaling series, per metric
    axes: dict[str, Axes] = field(default_factory=dict)  # steps and data axes, per metric
    comparisons: list[Comparison] = field(default_factory=list)
    details: Verdict | None = None
    parent_run_id: str | None = None  # set when the records came from an MLflow sweep
    mixed_code: str = ""  # names the runs on other code versions; '' when they share one
    answer: str = ""  # the report's first paragraph: the answer per lever, in the verdict's metric
    primary: str = ""  # the metric the verdict decides on
    contrasts: list[Contrast] = field(default_factory=list)  # the comparisons at equal cost
    joints: dict[str, Axis | None] = field(default_factory=dict)  # data and steps doubled together, per metric
    levers: list[Lever] = field(default_factory=list)  # steps, data, joint in the verdict's metric

    @property
    def tag(self) -> str:
        """The `verdict` tag value: under-trained | data-limited | bottleneck:<which> | undetermined."""
        return f"bottleneck:{self.bottleneck}" if self.verdict == "bottleneck" else self.verdict


def _axis_numbers(axes: dict[str, Axes]) -> dict[str, float]:
    out: dict[str, float] = {}
    for metric, ax in axes.items():
        p = f"analysis/{SHORT.get(metric, 'loss')}"
        for name, axis in (("steps", ax.steps), ("data", ax.data)):
            if axis is not None:
                out.update(axis.gain.as_metrics(f"{p}_{name}_gain_2x"))
                out[f"{p}_{name}_cost_2x_s"] = axis.seconds
    for key, value in next(iter(axes.values())).costs.items() if axes else ():
        out[f"analysis/cost_{key}"] = value
    return out


def _numbers(runs, n_sizes, fits, comparisons, gap, axes, verdict) -> dict[str, float]:
    out: dict[str, float] = {"analysis/runs": len(runs), "analysis/data_sizes": n_sizes,
                             "analysis/verdict_code": VERDICT_CODES[verdict.kind]}
    for metric, fit in fits.items():
        p = f"analysis/{SHORT.get(metric, 'loss')}"
        if len(fit.n):
            out["analysis/n_max"] = fit.n_max
        out.update(fit.local_gain.as_metrics(f"{p}_local_gain"))
        if fit.ok:
            out.update(fit.gain_per_doubling.as_metrics(f"{p}_gain_per_doubling"))
            out.update(fit.projections["2x"].as_metrics(f"{p}_at_2x"))
            out.update(fit.params["y_inf"].as_metrics(f"{p}_inf"))
            for family in fit.families[1:]:
                out.update(family.gain.as_metrics(f"{p}_logquad_gain_per_doubling"))
                out.update(family.at_2x.as_metrics(f"{p}_logquad_at_2x"))
            out[f"{p}_family_gain_spread"] = fit.gain_spread
            out[f"{p}_family_at_2x_spread"] = fit.at_2x_spread
            out[f"{p}_has_ceiling"] = float(fit.ceiling is not None)
            if fit.ceiling is not None:
                out.update(fit.ceiling.as_metrics(f"{p}_ceiling"))
            out.update(fit.params["alpha"].as_metrics(f"{p}_alpha"))
            out.update(fit.fitted_nmax.as_metrics(f"{p}_fit_nmax"))
        if math.isfinite(fit.sigma):
            out[f"{p}_sigma"] = fit.sigma
    if gap is not None:
        out.update(gap.as_metrics("analysis/train_val_gap"))
    out.update(_axis_numbers(axes))
    for c in comparisons:
        p = f"analysis/{c.key}/{SHORT.get(c.metric, 'loss')}"
        out.update(c.best_vs_baseline.as_metrics(f"{p}_best_vs_baseline"))
        out.update(c.best_vs_worst.as_metrics(f"{p}_best_vs_worst"))
    return {k: float(v) for k, v in out.items() if math.isfinite(float(v))}


def _plots(fits, series, base_runs, comparisons, axes, out: Path, level: float) -> dict[str, Path]:
    """series: the data-scaling runs (fits); base_runs: every run of the baseline config (steps x data)."""
    paths: dict[str, Path] = {}
    grid = plots.steps_data_plot(base_runs, axes, out / "steps_vs_data.png")
    if grid is not None:
        paths["steps_vs_data"] = grid
    for metric, fit in fits.items():
        if len(fit.n):
            name = f"scaling_{SHORT.get(metric, 'loss')}"
            paths[name] = plots.scaling_plot(fit, series, out / f"{name}.png", level)
    acc = plots.accuracy_plot(series, out / "accuracy_by_step.png")
    if acc is not None:
        paths["accuracy_by_step"] = acc
    by_key: dict[str, list[Comparison]] = {}
    for c in comparisons:
        by_key.setdefault(c.key, []).append(c)
    for key, cs in by_key.items():
        name = "compare_" + key.replace(".", "_")
        paths[name] = plots.comparison_plot(cs, out / f"{name}.png")
    return paths


def _shifts(vn: ValNoise | None, groups, n_boot: int) -> np.ndarray | None:
    """[n_boot, groups] validation-sample shifts of each group's mean, None without per-sample results."""
    if vn is None or not vn.shifts or n_boot <= 0:
        return None
    return np.stack([vn.group_shift(g, n_boot) for _, g in groups], axis=1)


def _other_series(runs, baseline, lk, noise, th, level, n_boot, seed, vn=None) -> dict[str, PowerLawFit]:
    """Loss fits of every other config swept over enough data sizes (e.g. a layer x data grid), labelled by
    how the config differs from the baseline: shown next to the baseline's (EAGLE-2-like flat vs rising)."""
    base = dict(baseline)
    out = {}
    for config in sorted({r.config for r in runs} - {baseline}):
        groups = by_group([r for r in runs if r.config == config and not r.probe])
        if len(groups) >= th.min_points:
            name = ", ".join(f"{k}={v}" for k, v in config if base.get(k) != v) or "(same)"
            have = [(n, [r for r in g if math.isfinite(r.value(lk))]) for n, g in groups]
            out[name] = fit_power_law(lk, [(n, values(g, lk)) for n, g in have], sign=1, seed_sigma=noise[0],
                                      seed_df=noise[1], level=level, n_boot=n_boot, seed=seed,
                                      min_points=th.min_points, shifts=_shifts(vn, have, n_boot))
    return out


def _data_series(base_runs):
    """The runs the data-scaling curve is drawn from: the converged ones when there are any; else, on a
    steps x data grid, the largest step budget; else every run (one per N: a fixed-epoch sweep)."""
    converged = [r for r in base_runs if r.converged and not r.probe]
    if len({r.group for r in converged}) >= 2:
        return converged
    clusters = step_clusters(base_runs)
    budgets = sorted(set(clusters.values()), reverse=True)
    for s in budgets:
        runs = [r for r in base_runs if clusters.get(r.run_id) == s]
        if len({r.group for r in runs}) >= 2:
            return runs
    return base_runs


def _nothing(reason: str, out_dir) -> AnalysisResult:
    """A sweep with nothing to fit is undetermined, not an error: the sweep's own runs stay valid."""
    headline = f"Undetermined: nothing to analyse: {reason}."
    report = f"# Sweep analysis\n\n**Verdict: undetermined.** {headline}\n"
    paths = {}
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        paths["report"] = Path(out_dir) / "report.md"
        paths["report"].write_text(report)
    return AnalysisResult("undetermined", None, headline, [reason], [], {"analysis/verdict_code": 0.0},
                          report, paths)


def analyze(records: list[dict], out_dir: str | Path | None = None, thresholds: Thresholds = Thresholds(),
            level: float = 0.9, n_boot: int = 400, seed: int = 0, allow_mixed_code: bool = False,
            report_path: str | Path | None = None, command: str = "") -> AnalysisResult:
    """Fits, comparisons and the verdict for one sweep's job records (format: `draftlab.analysis.records`).

    With `out_dir`, writes `report.md` and the PNG plots there; with `report_path` (docs/<name>.md), the report
    goes there instead and the plots into `<name>_figures/` beside it, linked relatively; `command` is what
    the report says generated it. Deterministic for a given `seed`. Runs on more than one code version make
    the verdict undetermined unless `allow_mixed_code`.
    """
    if report_path is not None:
        report_path = Path(report_path)
        out_dir = report_path.parent / f"{report_path.stem}_figures"
    if not records:
        return _nothing("no finished job records (did the sweep run any job to the end?)", out_dir)
    # a job without a train stage (e.g. stages=[generate]) has no result to weigh, and would move N's source
    trained = [bool(set(r.get("metrics") or {}) & set(LOSS_KEYS)) for r in records]
    left_out = [str(r.get("run_id", i)) for i, (r, t) in enumerate(zip(records, trained)) if not t]
    records = [r for r, t in zip(records, trained) if t] or records  # none trained: the loss check below says so
    try:
        runs, n_source = normalise(records)
    except ValueError as err:
        return _nothing(str(err), out_dir)
    baseline = baseline_config(runs)
    base_runs = [r for r in runs if r.config == baseline]
    lk = loss_key(runs)
    if lk is None:
        return _nothing("no validation loss in the records (metric val/loss or best/val_loss): did the "
                        "sweep run the train stage?", out_dir)
    # the loss, deployed tau (bench) and the tau training predicts; the verdict decides on tau (currency.py)
    metrics = [lk] + [k for k in (TAU_KEY, PREDICTED_TAU_KEY) if any(math.isfinite(r.value(k)) for r in runs)]
    primary = primary_metric(base_runs, lk)
    series = _data_series(base_runs)
    groups = by_group(series)
    rate = tau_per_loss(series, lk, primary) if primary != lk else math.nan
    th = with_loss_line(thresholds, rate)
    noise = {m: metric_noise(runs, m) for m in metrics}
    vnoise = {m: val_noise(runs, m, n_boot, seed + 1000 + i) for i, m in enumerate(metrics)}
    axes = {m: measure_axes(base_runs, m, th, level, n_boot, seed + 10 * i, vnoise[m])
            for i, m in enumerate(metrics)}
    joints = {m: joint_axis(base_runs, m, axes[m], level, n_boot, seed + 10 * i + 5, vnoise[m], th.min_points)
              for i, m in enumerate(metrics)}
    nmax_runs = groups[-1][1]
    val_nmax = float(np.mean(values(nmax_runs, lk))) if values(nmax_runs, lk).size else math.nan
    fits = {}
    for i, m in enumerate(metrics):
        sigma, df = axes[m].sigma, axes[m].df
        have = [(n, [r for r in g if math.isfinite(r.value(m))]) for n, g in groups]
        fits[m] = fit_power_law(m, [(n, values(g, m)) for n, g in have], sign=-direction(m),
                                lower=1.0 if direction(m) > 0 else 0.0, seed_sigma=sigma, seed_df=df, level=level,
                                n_boot=n_boot, seed=seed + i, min_points=th.min_points,
                                shifts=_shifts(vnoise[m], have, n_boot), material=material(m, val_nmax, th))
    gap = train_val_gap(nmax_runs, lk, level)
    comparisons = compare_all(runs, baseline, metrics, noise, level, vnoise)
    contrasts = equal_cost.contrasts(comparisons, runs, baseline, axes, th)
    others = _other_series(runs, baseline, lk, noise[lk], th, level, n_boot, seed, vnoise[lk])
    mixed = mixed_code(runs)
    verdict = decide(axes, contrasts, val_nmax, gap, th, "" if allow_mixed_code else mixed, primary, joints)
    if mixed and allow_mixed_code:
        verdict.evidence.insert(0, f"{mixed}: compared anyway (--allow-mixed-code)")
    paths: dict[str, Path] = {}
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = _plots(fits, series, base_runs, comparisons, axes, out, level)
    links = f"{Path(out_dir).name}/" if report_path is not None else ""
    found = levers(axes[primary], joints[primary], {"steps": verdict.steps_state, "data": verdict.data_state,
                                                    "joint": verdict.joint_state})
    said = answer(verdict, found, contrasts, fits.get(primary), th, equal_cost_run(axes[primary], joints[primary]))
    said = "\n".join(wrap([" ".join([said, tau_during_training(runs)[0]]).strip()]))  # one text, wrapped once
    report = render(verdict, fits, comparisons, runs, series, baseline, lk, n_source, gap, paths,
                    th, level, others, axes, vnoise[lk], links, command, left_out,
                    Extras(said, contrasts, joints, found, currency.describe(rate, th)))
    if out_dir is not None:
        paths["report"] = report_path or Path(out_dir) / "report.md"
        paths["report"].write_text(report)
    numbers = _numbers(runs, len(groups), fits, comparisons, gap, axes, verdict)
    numbers.update(_lever_numbers(found, contrasts, th, rate))
    numbers["analysis/mixed_code"] = float(bool(mixed))
    numbers["analysis/val_noise_in_intervals"] = float(vnoise[lk].known)
    result = AnalysisResult(verdict.kind, verdict.bottleneck, verdict.headline, verdict.evidence,
                            verdict.next_steps, numbers, report, paths, fits, axes, comparisons, verdict)
    result.mixed_code, result.answer, result.primary = mixed, said, primary
    result.contrasts, result.joints, result.levers = contrasts, joints, found
    return result


def _lever_numbers(found, contrasts, th, rate) -> dict[str, float]:
    """`analysis/lever_<name>_*`: each lever's gain in the verdict's metric and its GPU-seconds per line, and
    `analysis/<factor>_<basis>` for the comparisons at equal cost."""
    out: dict[str, float] = {"analysis/tau_per_loss": rate, "analysis/loss_line": th.material_loss_abs}
    for lv in found:
        out.update(lv.gain.as_metrics(f"analysis/lever_{lv.name}_gain"))
        out[f"analysis/lever_{lv.name}_gpu_s"] = lv.seconds
        out.update(lv.per_line(th.material_tau).as_metrics(f"analysis/lever_{lv.name}_s_per_line"))
    for x in contrasts:
        p = f"analysis/{x.comparison.key}/{SHORT.get(x.comparison.metric, 'loss')}"
        for basis, e in (("equal_steps", x.equal_steps), ("equal_gpu_s", x.equal_seconds)):
            if e is not None:
                out.update(e.as_metrics(f"{p}_{basis}"))
    return {k: float(v) for k, v in out.items() if math.isfinite(float(v))}

