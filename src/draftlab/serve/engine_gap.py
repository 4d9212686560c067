"""The local engine beside SGLang on the same draft and prompts (serve.backend=both): which numbers are the deployed
ones, and how far apart the two engines' tau are.

SGLang is what users deploy, so when it ran its first set gives the run's headline keys (bench/tau, bench/speedup,
bench/tokens_per_s, bench/baseline_tokens_per_s, bench/accept_length, bench/bs<B>/...). The gap is SGLang's pooled
tau minus the local engine's on the same prompts, with a 95% paired bootstrap over the prompts: both engines answer
every resampled prompt, so the prompts' own spread cancels and what is left is the engines' difference.
"""

from __future__ import annotations

import numpy as np

from draftlab.stats.intervals import RESAMPLES

HEADLINE = ("tau", "speedup", "tokens_per_s", "baseline_tokens_per_s", "accept_length")


def deployed_metrics(metrics: dict, first: str, prefix: str = "bench/sglang") -> dict[str, float]:
    """The headline keys, taken from `prefix`'s first set and batch sizes."""
    out = {f"bench/{k}": metrics[f"{prefix}/{first}/{k}"] for k in HEADLINE if f"{prefix}/{first}/{k}" in metrics}
    out.update({"bench/" + k[len(prefix) + 1:]: v for k, v in metrics.items() if k.startswith(f"{prefix}/bs")})
    return out


def tau_gap(name: str, local_rows: list[dict], sglang_rows: list[dict], seed: int) -> dict[str, float]:
    """bench/sglang/<set>/tau_gap (+ _lo/_hi): SGLang's tau minus the local engine's on the same prompts."""
    by_prompt = {r["prompt"]: r for r in local_rows}
    pairs = [(by_prompt[r["prompt"]], r) for r in sglang_rows if r["prompt"] in by_prompt]
    if not pairs:
        return {}
    x = np.array([[lo["tokens"], lo["verify_steps"], sg["tokens"], sg["verify_steps"]] for lo, sg in pairs], float)
    idx = np.random.default_rng(seed).integers(0, len(pairs), size=(RESAMPLES, len(pairs)))
    sums = x[idx].sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = sums[:, 2] / sums[:, 3] - sums[:, 0] / sums[:, 1]
    total = x.sum(axis=0)
    lo, hi = np.percentile(boot[np.isfinite(boot)], [2.5, 97.5])
    p = f"bench/sglang/{name}"
    return {f"{p}/tau_gap": float(total[2] / total[3] - total[0] / total[1]), f"{p}/tau_gap_lo": float(lo),
            f"{p}/tau_gap_hi": float(hi), f"{p}/same_length_frac": _same_length(pairs)}


def _same_length(pairs) -> float:
    """Prompts whose speculative answer has the same length in both engines: where it differs, bf16 near-ties
    took the answers apart, and tau is then measured on other text."""
    return sum(lo["tokens"] == sg["tokens"] for lo, sg in pairs) / len(pairs)
