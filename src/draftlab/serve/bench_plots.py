"""The bench stage's figures, from its metrics alone (so a figure shows exactly what was logged): acceptance by
draft position per set, tau per set, and the speed-up per batch size, each with its 95% interval where one exists;
and the local engine's accept-length histogram, from its generations. Written into the stage folder; the bench
entry (serve/bench.py) returns their paths, and the stage hands them to the reporter as artifacts."""

from __future__ import annotations

from pathlib import Path

from draftlab.util import fsutil


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    with fsutil.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    _pyplot().close(fig)
    return path


def _errors(metrics: dict, names: list[str]) -> tuple[list[float], list[list[float]]]:
    """Point values and matplotlib's [below, above] error lengths (0 where no interval was logged)."""
    points = [metrics[n] for n in names]
    below = [max(0.0, p - metrics.get(f"{n}_lo", p)) for n, p in zip(names, points)]
    above = [max(0.0, metrics.get(f"{n}_hi", p) - p) for n, p in zip(names, points)]
    return points, [below, above]


def acceptance_by_position(metrics: dict, sets: list[str], num_steps: int, out: Path) -> Path | None:
    """P(at least j drafts accepted) per verify step, j = 1..k, one line per set; None without such metrics."""
    shown = [s for s in sets if f"bench/{s}/accept_rate_0" in metrics]
    if not shown:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    xs = list(range(1, num_steps + 1))
    for i, name in enumerate(shown):
        points, err = _errors(metrics, [f"bench/{name}/accept_rate_{j}" for j in range(num_steps)])
        ax.errorbar([x + 0.06 * i for x in xs], points, yerr=err, marker="o", capsize=3, label=name)
    ax.set_xticks(xs)
    ax.set_xlabel("draft position j (at least j drafts accepted)")
    ax.set_ylabel("share of verify steps")
    ax.set_ylim(0, 1)
    ax.set_title("acceptance by draft position (95% intervals over prompts)")
    ax.legend()
    fig.tight_layout()
    return _save(fig, out / "accept_by_position.png")


def tau_by_set(metrics: dict, sets: list[str], predicted: float | None, out: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    points, err = _errors(metrics, [f"bench/{s}/tau" for s in sets])
    ax.errorbar(range(len(sets)), points, yerr=err, fmt="o", capsize=5, label="deployed")
    tf = [(i, metrics[f"bench/{s}/tf_tau"]) for i, s in enumerate(sets) if f"bench/{s}/tf_tau" in metrics]
    if tf:  # training's count on the same answers: the gap to it is the definition (serve/teacher_forced.py)
        ax.plot([i for i, _ in tf], [v for _, v in tf], "x", markersize=9, label="training's count, same answers")
    if predicted is not None:
        ax.axhline(predicted, linestyle="--", color="gray", label=f"predicted (train) {predicted:.2f}")
    ax.legend()
    ax.set_xticks(range(len(sets)), sets)
    ax.set_xlim(-0.5, len(sets) - 0.5)
    ax.set_ylabel("tau (tokens per verify step)")
    ax.set_title("deployed tau per set (95% intervals over prompts)")
    fig.tight_layout()
    return _save(fig, out / "tau_by_set.png")


def speedup_by_batch(metrics: dict, sizes: list[int], out: Path) -> Path | None:
    shown = [b for b in sizes if f"bench/bs{b}/speedup" in metrics]
    if not shown:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    ax.plot(range(len(shown)), [metrics[f"bench/bs{b}/speedup"] for b in shown], marker="o")
    ax.axhline(1.0, linestyle=":", color="gray")
    ax.set_xticks(range(len(shown)), [str(b) for b in shown])
    ax.set_xlabel("batch size")
    ax.set_ylabel("speed-up (tokens/s, speculative / plain)")
    ax.set_title("speed-up by batch size")
    fig.tight_layout()
    return _save(fig, out / "speedup_by_batch.png")


def accept_histogram(spec: list, num_steps: int, out: Path) -> tuple[Path, Path]:
    """Accept length per verify step of the speculative Generations `spec` (accepted drafts + bonus, 1..k+1), as
    accept_hist.json and accept_hist.png."""
    lengths = list(range(1, num_steps + 2))
    counts = [0] * len(lengths)
    for g in spec:
        for a in g.accepted:
            counts[a] += 1
    js = out / "accept_hist.json"
    fsutil.atomic_write_json(js, {"accept_length": lengths, "count": counts,
                                  "note": "tokens committed per verify step, bonus included, before truncation"})
    fig, ax = _pyplot().subplots(figsize=(5, 3.2))
    ax.bar(lengths, counts)
    ax.set_xlabel("accept length (drafts accepted + bonus)")
    ax.set_ylabel("verify steps")
    total = sum(counts)
    mean = sum(length * c for length, c in zip(lengths, counts)) / total if total else 0.0
    ax.set_title(f"num_steps={num_steps}, mean accept length {mean:.2f}")
    fig.tight_layout()
    return js, _save(fig, out / "accept_hist.png")
