"""The bench in the local engine: the draft loaded as SGLang would (serve/loader.py) and served on static KV caches
with CUDA graphs or not as `bench.static_cache` / `bench.cuda_graphs` say (serve/modes.py).

Every set is measured in one engine (one warm-up, one set of graph captures, serve/measure.py), then split back
into sets (serve/set_metrics.py); the first set's numbers are also the headline bench/* keys, beside the speed-up
bound the measured step costs allow (serve/step_costs.py). Batch sizes above 1 run the batched engine
(serve/batch_bench.py) on the first set's prompts. Writes `generations.jsonl`, for eyeballing.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Callable

import torch

from draftlab.serve import step_costs
from draftlab.serve.batch_bench import batch_one_metrics, measure_batch_size
from draftlab.serve.measure import BenchRun, EngineResult, measure, summarize
from draftlab.serve.modes import engine_mode, load_drafter
from draftlab.serve.set_metrics import metrics_of_set, per_prompt_rows, split, teacher_forced
from draftlab.serve.static_target import static_cache_obstacle
from draftlab.util import fsutil

log = logging.getLogger("draftlab")


def serve_dtype(spec: str, target_dtype: torch.dtype) -> torch.dtype:
    return target_dtype if spec == "auto" else getattr(torch, spec)


def run_local(serve, bench, draft: Path, target_cfg, models: Path, prompts_for: Callable, out: Path,
              batches: bool = True) -> EngineResult:
    """Every set of `prompts_for(tokenizer)` (name -> ids) measured, then each batch size above 1 (unless
    `batches` is false: beside SGLang, concurrent requests are SGLang's to measure)."""
    from draftlab.target.target import load_target

    target = load_target(target_cfg, models)
    prompts = prompts_for(target.tokenizer)
    if serve.topk != 1:
        log.warning("bench: the local engine drafts a chain (topk 1); serve.topk=%d is ignored", serve.topk)
    mode = engine_mode(bench.static_cache, bench.cuda_graphs, target.device, target.model)
    drafter, loaded = load_drafter(draft, target.model, mode, serve.sglang_rules,
                                   serve_dtype(serve.dtype, target.dtype))
    k = serve.num_steps
    torch.manual_seed(bench.seed)
    run = measure(target.model, drafter, [p for ids in prompts.values() for p in ids], k, bench.max_new_tokens,
                  bench.temperature, target.eos_token_ids, bench.seed, mode=mode)
    if mode.cuda_graphs:
        log.info("bench: engine steps (%s): %s", mode.name, run.graphs)
    metrics, rows, runs = _per_set(run, prompts, target.model, drafter, k, bench)
    metrics["bench/sync_free"] = float(run.sync_free)
    metrics.update(_bound_metrics(run.step_ms, metrics, k))
    first = next(iter(prompts))
    for size in _larger_batch_sizes(bench, batches, target.model, mode):
        metrics.update(measure_batch_size(target.model, drafter, prompts[first], size, k, bench.max_new_tokens,
                                          bench.temperature, target.eos_token_ids, bench.seed))
    _write_generations(rows, run, out / "generations.jsonl")
    return EngineResult(metrics, loaded.problems(), rows, prompts, runs[0].spec)  # the first set's, as bench/tau


def _per_set(run: BenchRun, prompts: dict, model, drafter, k: int, bench) -> tuple[dict, list[dict], list]:
    """(metrics, rows, each set's BenchRun): the first set's pooled numbers as bench/*, every set's as
    bench/<set>/*, with teacher-forced tau beside them when greedy."""
    names = list(prompts)
    sizes = [len(prompts[n]) for n in names]
    runs = [BenchRun(spec, base) for spec, base in zip(split(run.spec, sizes), split(run.base, sizes))]
    summaries = [summarize(part, k, bench.temperature) for part in runs]
    metrics, rows = dict(summaries[0]), []
    for name, part, summary in zip(names, runs, summaries):
        set_rows = per_prompt_rows(name, part.spec, part.base)
        metrics.update(metrics_of_set(name, set_rows, summary, k, bench.seed))
        if bench.temperature <= 0:  # the same prompts and positions, by training's count and by deployment's
            metrics.update(teacher_forced(name, set_rows, prompts[name], part.base, model, drafter, k))
        rows += set_rows
    metrics.update(batch_one_metrics(metrics, names[0]))
    return metrics, rows, runs


def _bound_metrics(step_ms: dict, metrics: dict, k: int) -> dict[str, float]:
    """The bound the measured step costs allow, beside the speed-up reached (first set); none without them."""
    if not step_ms:
        return {}
    m = {f"bench/{name}": ms for name, ms in step_ms.items()}
    tau, speedup = metrics["bench/tau"], metrics["bench/speedup"]
    m["bench/speedup_bound"] = step_costs.bound(tau, k, step_ms)
    m["bench/speedup_of_bound"] = speedup / m["bench/speedup_bound"]
    m["bench/speedup_bound_with_verify"] = step_costs.bound_with_verify(tau, k, step_ms)
    log.info("bench: speed-up %.2fx, %.0f%% of the bound %.2fx = tau %.2f / (1 + %d x %.3f ms draft step / "
             "%.3f ms target step); %.2fx with the verify step as measured (%.3f ms)", speedup,
             100 * m["bench/speedup_of_bound"], m["bench/speedup_bound"], tau, k, step_ms["draft_step_ms"],
             step_ms["target_step_ms"], m["bench/speedup_bound_with_verify"], step_ms["verify_step_ms"])
    return m


def _larger_batch_sizes(bench, batches: bool, model, mode) -> list[int]:
    larger = [b for b in bench.batch_sizes if b > 1] if batches else []
    obstacle = static_cache_obstacle(model.config)
    if larger and obstacle:  # the batched engine writes each row into a preallocated static cache
        log.warning("bench: batch sizes %s skipped: %s, and the batched engine needs the static KV cache", larger,
                    obstacle)
        return []
    if larger and mode.cuda_graphs:
        log.info("bench: batch sizes %s run eagerly (the batched engine has no CUDA graphs yet); batch size 1 "
                 "keeps them", larger)
    return larger


def _write_generations(rows: list[dict], run: BenchRun, path: Path) -> None:
    lines = [json.dumps({"set": r["set"], "prompt": r["prompt"], "tau": s.tau, "accepted": s.accepted,
                         "tokens": s.tokens, "baseline_tokens": b.tokens, "spec_s": s.seconds, "base_s": b.seconds})
             for r, s, b in zip(rows, run.spec, run.base)]
    fsutil.atomic_write_text(path, "\n".join(lines) + "\n")
