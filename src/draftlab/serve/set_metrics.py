"""A bench measurement split back into its prompt sets, and each set's numbers: the per-prompt rows, the
bootstrapped bench/<set>/... metrics (stats/intervals.py), training's and deployment's tau on the same answers
(serve/teacher_forced.py), and a warning for a set whose interval decides nothing.
"""

from __future__ import annotations

import logging

from draftlab.stats.intervals import set_metrics, why_undecidable

log = logging.getLogger("draftlab")
# the engine's own per-set numbers (its summarize() of the set), copied under bench/<set>/
SUMMARY_KEYS = ("accept_length", "mean_accepted", "greedy_match_frac")


def split(items: list, sizes: list[int]) -> list[list]:
    """items cut into consecutive pieces of `sizes`."""
    out, start = [], 0
    for n in sizes:
        out.append(items[start: start + n])
        start += n
    return out


def per_prompt_rows(name: str, spec: list, base: list) -> list[dict]:
    """One row per prompt of a set, from its Generations (the per-prompt table, and the bootstrap's input)."""
    return [{"set": name, "prompt": i, "prompt_tokens": s.prompt_len, "tokens": len(s.tokens),
             "verify_steps": s.verify_steps, "tau": s.tau, "accepted": list(s.accepted), "spec_s": s.seconds,
             "baseline_tokens": len(b.tokens), "base_s": b.seconds, "greedy_match": s.tokens == b.tokens}
            for i, (s, b) in enumerate(zip(spec, base))]


def metrics_of_set(name: str, rows: list[dict], engine_summary: dict, num_steps: int, seed: int) -> dict:
    """bench/<set>/...: the bootstrapped metrics, and the engine's own per-set summary numbers."""
    m = set_metrics(f"bench/{name}", rows, num_steps, seed)
    for key in SUMMARY_KEYS:
        if f"bench/{key}" in engine_summary:
            m[f"bench/{name}/{key}"] = engine_summary[f"bench/{key}"]
    return m


def warn_if_undecidable(names: list[str], metrics: dict) -> None:
    """A set whose interval decides nothing says so, in the log and thereby in the run's summary."""
    for name in names:
        p = f"bench/{name}"
        why = why_undecidable(metrics[f"{p}/tau"], metrics[f"{p}/tau_lo"], metrics[f"{p}/tau_hi"],
                              int(metrics[f"{p}/prompts"]))
        if why:
            log.warning("bench: set %s: tau %.3g (95%% %.3g-%.3g) is %s", name, metrics[f"{p}/tau"],
                        metrics[f"{p}/tau_lo"], metrics[f"{p}/tau_hi"], why)


def teacher_forced(name: str, rows: list[dict], prompts: list[list[int]], base: list, target_model, drafter,
                   k: int) -> dict[str, float]:
    """bench/<set>/tf_tau (training's predicted tau on these prompts and answer positions) and walk_tau
    (deployment's count over the same teacher-forced chains), serve/teacher_forced.py; rows get their parts."""
    from draftlab.serve.teacher_forced import pooled, prompt_row

    for row, prompt, plain in zip(rows, prompts, base):
        row.update(prompt_row(target_model, drafter.model, drafter.feature_layers, prompt, plain.tokens, k))
    return {f"bench/{name}/{key}": value for key, value in pooled(rows, k).items()}
