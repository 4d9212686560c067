"""Tokens/s at batch sizes above 1: the batched engine against the batched plain decode, on the same rows.

Rows are the prompts in order, cycled until every batch is full (a part-filled last batch would time fewer rows
than its size says). Batches alternate which decoder runs first, as the batch-1 measurement alternates prompts.
Metrics per size B: bench/bs<B>/tokens_per_s, baseline_tokens_per_s, speedup (their ratio), tau (tokens per
verify step over the rows), greedy_match_frac (rows whose speculative output equals the plain one; temperature 0).
"""

from __future__ import annotations

import gc
import logging

import torch

from draftlab.util.progress import bar_over
from draftlab.serve.batch_engine import BatchSpecEngine, batch_target_decode
from draftlab.serve.batch_runners import BatchEagle3Drafter, BatchTargetRunner

log = logging.getLogger("draftlab")


def filled_batches(prompts: list[list[int]], size: int) -> list[list[list[int]]]:
    """ceil(n / size) batches of exactly `size` rows, the prompts cycled to fill the last."""
    count = -(-len(prompts) // size)
    rows = [prompts[i % len(prompts)] for i in range(count * size)]
    return [rows[i: i + size] for i in range(0, len(rows), size)]


def batched_drafter(drafter) -> BatchEagle3Drafter:
    """The batched drafter on the served draft's own weights (the static and the dynamic drafter both hold them)."""
    return BatchEagle3Drafter(drafter.model, tuple(drafter.feature_layers))


@torch.inference_mode()
def measure_batch_size(model, drafter, prompts: list[list[int]], size: int, num_steps: int, max_new_tokens: int,
                       temperature: float, eos_token_ids, seed: int = 0) -> dict[str, float]:
    engine = BatchSpecEngine(model, batched_drafter(drafter), num_steps, eos_token_ids)
    runner = BatchTargetRunner(model)
    gen = torch.Generator(device=runner.device)

    def seeded(i):
        return gen.manual_seed(seed + i) if temperature > 0 else None

    batches = filled_batches(prompts, size)
    warm = min(2 * (num_steps + 1) + 2, max_new_tokens)  # allocations and kernel choices stay out of the timings
    engine.generate(batches[0], warm, temperature, seeded(len(batches)))
    batch_target_decode(runner, batches[0], warm, eos_token_ids, temperature, seeded(len(batches)))
    spec, base = [], []
    for i, rows in enumerate(bar_over(batches, f"bench bs{size}", "batch")):
        order = [("spec", rows), ("base", rows)] if i % 2 == 0 else [("base", rows), ("spec", rows)]
        for which, r in order:
            if which == "spec":
                spec.append(engine.generate(r, max_new_tokens, temperature, seeded(i)))
            else:
                base.append(batch_target_decode(runner, r, max_new_tokens, eos_token_ids, temperature, seeded(i)))
    del engine, runner
    gc.collect()
    return batch_metrics(size, spec, base, temperature)


def batch_metrics(size: int, spec: list, base: list, temperature: float) -> dict[str, float]:
    """spec, base: per batch, its rows' Generations (each row carries its batch's seconds)."""
    p = f"bench/bs{size}"
    tokens = sum(len(g.tokens) for batch in spec for g in batch)
    steps = sum(g.verify_steps for batch in spec for g in batch)
    spec_s = sum(batch[0].seconds for batch in spec)
    base_tokens = sum(len(g.tokens) for batch in base for g in batch)
    base_s = sum(batch[0].seconds for batch in base)
    m = {f"{p}/tokens_per_s": tokens / spec_s if spec_s > 0 else float("nan"),
         f"{p}/baseline_tokens_per_s": base_tokens / base_s if base_s > 0 else float("nan"),
         f"{p}/tau": tokens / steps if steps else float("nan"),
         f"{p}/rows": float(sum(len(batch) for batch in spec))}
    m[f"{p}/speedup"] = m[f"{p}/tokens_per_s"] / m[f"{p}/baseline_tokens_per_s"]
    if temperature <= 0:
        pairs = [(s.tokens, b.tokens) for sb, bb in zip(spec, base) for s, b in zip(sb, bb)]
        m[f"{p}/greedy_match_frac"] = sum(s == b for s, b in pairs) / len(pairs)
    return m


def batch_one_metrics(first_set_metrics: dict[str, float], name: str) -> dict[str, float]:
    """Batch size 1 is the single-request engine's measurement of the first set (CUDA graphs where enabled)."""
    p = f"bench/{name}"
    return {"bench/bs1/tokens_per_s": first_set_metrics[f"{p}/tokens_per_s"],
            "bench/bs1/baseline_tokens_per_s": first_set_metrics[f"{p}/baseline_tokens_per_s"],
            "bench/bs1/speedup": first_set_metrics[f"{p}/speedup"],
            "bench/bs1/tau": first_set_metrics[f"{p}/tau"],
            "bench/bs1/rows": first_set_metrics[f"{p}/prompts"]}
