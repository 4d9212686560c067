"""The bench stage's prompt sets: their prompts as chat-templated ids, and one measurement split back into sets.

`sharegpt_val` reads the generate stage's held-out samples (already templated); every other set's texts are read
first (`read_texts`: a bad file fails before the target loads), then templated with the target's tokenizer and
kept within data.max_prompt_tokens, the training prompts' limit (`tokenize`). Each set is `bench.prompts` long.
"""

from __future__ import annotations

import logging
from pathlib import Path

from draftlab.data.bench_sets import HELD_OUT, BenchSet, parse_sets, set_texts
from draftlab.stats.intervals import set_metrics, why_undecidable

log = logging.getLogger("draftlab")
# the engine's own per-set numbers (its summarize() of the set), copied under bench/<set>/
SUMMARY_KEYS = ("accept_length", "mean_accepted", "greedy_match_frac")


def read_texts(cfg) -> tuple[list[BenchSet], dict[str, list[str]]]:
    """The sets, and the texts of every set but the held-out one (cheap: files only, no model)."""
    sets = parse_sets(list(cfg.bench.sets))
    return sets, {s.name: set_texts(s, cfg.bench.seed) for s in sets if s.kind != HELD_OUT}


def tokenize(cfg, sets: list[BenchSet], texts: dict[str, list[str]], samples_folder: Path, tokenizer,
             held_out) -> dict[str, list[list[int]]]:
    """Each set's prompt ids, in the order of `sets`. held_out(folder, count, limit) reads the val split."""
    from draftlab.data.prompts import Prompt
    from draftlab.data.pool import pool_size
    from draftlab.target.target import usable_prompts

    count, width = cfg.bench.prompts, cfg.data.max_prompt_tokens
    prompts = {}
    for s in sets:
        if s.kind == HELD_OUT:
            prompts[s.name] = held_out(samples_folder, count, limit=pool_size(cfg.data))
            continue
        usable = usable_prompts(tokenizer, [Prompt(t, str(i)) for i, t in enumerate(texts[s.name])], width, count)
        if not usable:
            raise ValueError(f"bench.sets: {s.name}: no prompt fits data.max_prompt_tokens={width} once templated")
        if len(usable) < count:
            log.warning("bench: set %s has %d prompts within data.max_prompt_tokens=%d, bench.prompts asks for %d",
                        s.name, len(usable), width, count)
        prompts[s.name] = [ids for _, ids in usable]
    return prompts


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
