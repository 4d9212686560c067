"""PNG plots of a sweep analysis (matplotlib, Agg backend: no display on the training machines)."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import numpy as np  # noqa: E402

from draftlab.analysis.compare import Comparison  # noqa: E402
from draftlab.analysis.fit import PowerLawFit  # noqa: E402
from draftlab.analysis.records import Run, by_group, step_clusters, values  # noqa: E402

ACC_KEY = re.compile(r"^val/acc_(\d+)$")


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def scaling_plot(fit: PowerLawFit, runs: list[Run], path: Path, level: float) -> Path:
    """The metric against N on a log axis: each run, the per-N means, each curve family with its band, and the
    2x projection (the furthest the analysis projects)."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for n, group in by_group(runs):
        v = values(group, fit.metric)
        ax.scatter(np.full(v.size, n), v, s=12, color="0.6", zorder=2)
    ax.plot(fit.n, fit.mean, "o", color="C0", label="mean per N", zorder=3)
    for i, family in enumerate(fit.families if fit.ok else []):
        if family.band is None:
            continue
        grid, mid, lo, hi = family.band
        color = f"C{i + 1}"
        ax.plot(grid, mid, "-", color=color, label=family.name)
        if not np.allclose(lo, hi):
            ax.fill_between(grid, lo, hi, color=color, alpha=0.15, label=f"{family.name} {level:.0%} band")
        p = family.at_2x
        err = [[p.value - p.lo], [p.hi - p.value]] if p.known else None
        ax.errorbar([2.0 * fit.n_max], [p.value], yerr=err, fmt="s", color=color, capsize=3)
    ax.set_xscale("log")
    ax.set_xlabel("training tokens N" if fit.n_max > 1e4 else "N")
    ax.set_ylabel(fit.metric)
    ax.set_title(f"{fit.metric}: gain per doubling {fit.gain_per_doubling.fmt(2)}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def accuracy_plot(runs: list[Run], path: Path) -> Path | None:
    """val/acc_j against TTT step j, one line per data size (means over seeds)."""
    steps = sorted({int(m.group(1)) for r in runs for k in r.metrics if (m := ACC_KEY.match(k))})
    if not steps:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, (n, group) in enumerate(by_group(runs)):
        means = [np.mean(values(group, f"val/acc_{j}")) if values(group, f"val/acc_{j}").size else np.nan
                 for j in steps]
        ax.plot(steps, means, "o-", color=plt.cm.viridis(i / max(1, len(by_group(runs)) - 1)),
                label=f"N={n:.3g}")
    ax.set_xticks(steps)
    ax.set_xlabel("TTT step j")
    ax.set_ylabel("val/acc_j")
    ax.set_title("per-step accuracy by data size")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def comparison_plot(comparisons: list[Comparison], path: Path) -> Path:
    """Bars of each setting of one factor (one panel per metric), seed sd as error bars."""
    fig, axes = plt.subplots(1, len(comparisons), figsize=(4.2 * len(comparisons), 3.8), squeeze=False)
    for ax, c in zip(axes[0], comparisons):
        labels = [lv.label for lv in c.levels]
        means = [lv.mean for lv in c.levels]
        sds = [lv.sd if np.isfinite(lv.sd) else 0.0 for lv in c.levels]
        colors = ["C0" if lv.baseline else "C2" for lv in c.levels]
        ax.bar(labels, means, yerr=sds, color=colors, capsize=4)
        lo, hi = min(m - s for m, s in zip(means, sds)), max(m + s for m, s in zip(means, sds))
        pad = 0.15 * (hi - lo) or 0.05 * abs(hi) or 1.0
        ax.set_ylim(lo - pad, hi + pad)  # differences, not absolute levels, are the point
        ax.set_title(f"{c.key} at N={c.n:.3g}")
        ax.set_ylabel(c.metric)
        ax.tick_params(axis="x", rotation=20)
    return _save(fig, path)


def steps_data_plot(runs: list[Run], axes: dict, path: Path) -> Path | None:
    """The loss against optimizer steps, one line per data size (budget runs), converged runs as stars:
    lines that keep falling are under-trained; the spread between lines at equal steps is the data effect."""
    if not axes:
        return None
    metric = next(iter(axes))
    clusters = step_clusters(runs)
    if len(set(clusters.values())) < 2 and not any(r.converged for r in runs):
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    groups = by_group(runs)
    for i, (n, group) in enumerate(groups):
        color = plt.cm.viridis(i / max(1, len(groups) - 1))
        cells: dict[float, list[float]] = {}
        for r in group:
            if r.run_id in clusters and np.isfinite(r.value(metric)):
                cells.setdefault(clusters[r.run_id], []).append(r.value(metric))
        if cells:
            xs = sorted(cells)
            ax.plot(xs, [np.mean(cells[x]) for x in xs], "o-", color=color, label=f"N={n:.3g}")
        conv = [(r.steps, r.value(metric)) for r in group if r.converged]
        if conv:
            ax.scatter(*zip(*conv), marker="*", s=90, color=color, edgecolor="k",
                       label=f"N={n:.3g} converged" if not cells else None)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("optimizer steps S")
    ax.set_ylabel(metric)
    ax.set_title("steps vs data (stars: early stopping fired)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)
