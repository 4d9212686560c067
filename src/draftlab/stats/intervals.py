"""A bench set's metrics with 95% intervals from a bootstrap over its prompts, and when they decide nothing.

Each prompt is one row: its completion tokens and verify steps (speculative run), its draft-acceptance counts per
verify step (local engine only), and its baseline tokens and seconds. Every statistic is a ratio of sums over the
prompts (pooled, as SGLang pools its server-wide average), so one resample of the prompts gives one value of each;
the interval is the 2.5th-97.5th percentile over RESAMPLES resamples drawn with `seed` (a percentile bootstrap:
the prompts are the unit that varies between runs of one recipe, not the verify steps within an answer).

Metrics, for set `s` (the `bench/<s>/` prefix): tau, tau_lo, tau_hi; accept_rate_<j> (+ _lo, _hi): P(at least
j+1 drafts accepted) per verify step; speedup (+ _lo, _hi); tokens_per_s, baseline_tokens_per_s; prompts,
tokens, verify_steps; tau_decidable (1.0 or 0.0, see `decidable`).
"""

from __future__ import annotations

import math

import numpy as np

RESAMPLES = 2000
# An interval decides nothing when it is wider than this fraction of its point value (tau 2.6 -> 0.26 wide: about
# the 2.53-2.74 spread of bench tau across eleven 50,000-sample runs of one recipe benched on 6 prompts), or when it
# rests on fewer than MIN_PROMPTS prompts (a bootstrap over a handful of prompts understates its own width).
TOO_WIDE = 0.10
MIN_PROMPTS = 10


def decidable(point: float, lo: float, hi: float, prompts: int) -> bool:
    """The one definition of an interval narrow enough to act on."""
    if prompts < MIN_PROMPTS or not all(math.isfinite(v) for v in (point, lo, hi)) or point <= 0:
        return False
    return (hi - lo) <= TOO_WIDE * point


def why_undecidable(point: float, lo: float, hi: float, prompts: int) -> str:
    """A short reason for the summary and the log; '' when the interval is decidable."""
    if decidable(point, lo, hi, prompts):
        return ""
    if prompts < MIN_PROMPTS:
        return f"too wide to decide anything: {prompts} prompts (fewer than {MIN_PROMPTS})"
    return f"too wide to decide anything: wider than {TOO_WIDE:.0%} of its value"


def _resampled_sums(columns: np.ndarray, seed: int) -> np.ndarray:
    """[RESAMPLES, c]: the column sums of each resample of the rows of `columns` [n, c]."""
    n = columns.shape[0]
    idx = np.random.default_rng(seed).integers(0, n, size=(RESAMPLES, n))
    return columns[idx].sum(axis=1)


def _ratio(num, den):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def _interval(values: np.ndarray) -> tuple[float, float]:
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return float("nan"), float("nan")
    lo, hi = np.percentile(finite, [2.5, 97.5])
    return float(lo), float(hi)


def set_metrics(prefix: str, rows: list[dict], num_steps: int, seed: int) -> dict[str, float]:
    """The metrics of one set from its per-prompt rows (keys: tokens, verify_steps, spec_s, baseline_tokens,
    base_s, and `accepted`, the drafts accepted per verify step, where the engine reports it)."""
    if not rows:
        raise ValueError(f"{prefix}: no prompts to summarise")
    has_accepts = all("accepted" in r for r in rows)
    cols = [[r["tokens"], r["verify_steps"], r["spec_s"], r["baseline_tokens"], r["base_s"]]
            + ([sum(a > j for a in r["accepted"]) for j in range(num_steps)] if has_accepts else [])
            for r in rows]
    x = np.asarray(cols, dtype=np.float64)
    point, boot = x.sum(axis=0), _resampled_sums(x, seed)

    def stats(s):  # every statistic, from (resampled) column sums; s: [..., c]
        tokens, steps, spec_s, base_tokens, base_s = (s[..., i] for i in range(5))
        out = {"tau": _ratio(tokens, steps),
               "speedup": _ratio(_ratio(tokens, spec_s), _ratio(base_tokens, base_s))}
        for j in range(num_steps if has_accepts else 0):
            out[f"accept_rate_{j}"] = _ratio(s[..., 5 + j], steps)
        return out

    m: dict[str, float] = {}
    resampled = stats(boot)
    for name, value in stats(point).items():
        lo, hi = _interval(resampled[name])
        m[f"{prefix}/{name}"], m[f"{prefix}/{name}_lo"], m[f"{prefix}/{name}_hi"] = float(value), lo, hi
    m[f"{prefix}/tokens_per_s"] = float(_ratio(point[0], point[2]))
    m[f"{prefix}/baseline_tokens_per_s"] = float(_ratio(point[3], point[4]))
    m[f"{prefix}/prompts"] = float(len(rows))
    m[f"{prefix}/tokens"] = float(point[0])
    m[f"{prefix}/verify_steps"] = float(point[1])
    m[f"{prefix}/tau_decidable"] = float(decidable(m[f"{prefix}/tau"], m[f"{prefix}/tau_lo"],
                                                   m[f"{prefix}/tau_hi"], len(rows)))
    return m


def tau_line(name: str, metrics: dict) -> str:
    """'tau 2.61 (95% 2.50-2.72, 80 prompts)', plus why it decides nothing when it does not."""
    p = f"bench/{name}"
    tau, lo, hi, n = (metrics.get(f"{p}/{k}") for k in ("tau", "tau_lo", "tau_hi", "prompts"))
    if tau is None:
        return "-"
    text = f"tau {tau:.3g} (95% {lo:.3g}-{hi:.3g}, {n:.0f} prompts)"
    why = why_undecidable(tau, lo, hi, int(n or 0))
    return f"{text}; {why}" if why else text
