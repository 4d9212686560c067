"""The bench stage's prompt sets: their prompts as chat-templated ids (serve/set_metrics.py splits a measurement
back into sets).

`sharegpt_val` reads the generate stage's held-out samples (already templated); every other set's texts are read
first (`read_texts`: a bad file fails before the target loads), then templated with the target's tokenizer and
kept within data.max_prompt_tokens, the training prompts' limit (`tokenize`). Each set is `bench.prompts` long.
"""

from __future__ import annotations

import logging
from pathlib import Path

from draftlab.data.bench_sets import HELD_OUT, BenchSet, parse_sets, set_texts

log = logging.getLogger("draftlab")


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
