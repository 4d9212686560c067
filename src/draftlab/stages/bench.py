"""Stage `bench`: deployed acceptance and speed of the trained draft on held-out prompts.

Inputs: `generate` (samples; the val split is never trained on) and `train` (`draft/` and `metrics.json`).
The stage reads the sets' prompts (stages/bench_sets.py) and training's predicted tau, and hands them to the one
serving entry, serve/bench.py's `bench`, whatever `serve.backend` says: `local` (the local engine,
serve/local_bench.py), `sglang` (the real SGLang server, sglang/bench.py) or `both` (SGLang first, then the local
engine at batch size 1 on the same prompts, and the gap between them, serve/engine_gap.py). The predicted-vs-deployed
alarm (serve/alarm.py) reads the deployed engine, SGLang when it ran, and may raise `DraftAlarm`; a draft that
passes it then runs `bench.sglang_grid` (sglang/grid.py).

Sets (`bench.sets`, stages/bench_sets.py): every set is measured in one engine, one prompt at a time. The local
engine reports `bench/<set>/tau` with `tau_lo`/`tau_hi` (95% bootstrap over prompts, stats/intervals.py),
`accept_rate_{j}`, `speedup` (each with _lo/_hi), `tokens_per_s`, `baseline_tokens_per_s`, `prompts`; SGLang the
same under `bench/sglang/<set>/`. The deployed engine's first set also gives the headline keys: `bench/tau`
(completion tokens / verify steps, SGLang's count), `bench/tokens_per_s` and `bench/baseline_tokens_per_s`
(measured alternately prompt by prompt in the local engine, so drift and warm-up hit both equally),
`bench/speedup`; the local engine alone adds `bench/accept_rate_{j}` (comparable to train's full_acc_j) and
`bench/tau_ratio`. Batch sizes (`bench.batch_sizes`): `bench/bs<B>/tokens_per_s`, `baseline_tokens_per_s`,
`speedup` on the first set's prompts; B = 1 is the measurement above, larger B the batched local engine
(serve/batch_bench.py) or B concurrent requests to SGLang.
Files: `accept_hist.json`, `accept_hist.png`, `accept_by_position.png`, `tau_by_set.png`, `speedup_by_batch.png`,
`per_prompt.json` (the per-prompt table, an `engine` column when SGLang ran), `generations.jsonl`, `metrics.json`,
`sglang_bench.json` and `grid.json` (SGLang's per-request records), then `manifest.json`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from draftlab.serve.bench import BenchResult, DraftAlarm, bench, read_predicted_tau
from draftlab.stages import bench_sets
from draftlab.util import fsutil
from draftlab.util.reporting import Reporter

log = logging.getLogger("draftlab")
FORMAT = "draftlab.bench/1"


def held_out_prompts(samples_folder: Path, count: int, limit: int | None = None) -> list[list[int]]:
    """The chat-templated prompts of the first `count` validation samples among the first `limit` (the job's
    data.samples): the same prompts whatever other jobs have added to the shared pool meanwhile."""
    from draftlab.data.samples import val_prompts

    prompts = val_prompts(samples_folder, count, limit)
    if not prompts:
        raise ValueError(f"{samples_folder}: no validation samples to bench on (data.val_fraction = 0?)")
    if len(prompts) < count:
        log.warning("bench: only %d held-out prompts available, bench.prompts asks for %d", len(prompts), count)
    return prompts


def run(cfg, out: Path, inputs: dict[str, Path], reporter: Reporter) -> dict[str, float]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    train_dir = Path(inputs["train"])
    draft_dir = train_dir / "draft"
    if not (draft_dir / "config.json").exists():
        raise FileNotFoundError(f"{draft_dir}: no exported draft (did the train stage finish?)")
    predicted, predicted_key = read_predicted_tau(train_dir)
    sets, texts = bench_sets.read_texts(cfg)  # a bad prompt file fails here, before any model loads

    def prompts(tokenizer) -> dict[str, list[list[int]]]:
        return bench_sets.tokenize(cfg, sets, texts, inputs["generate"], tokenizer, held_out_prompts)

    try:
        result = bench(cfg.serve, cfg.bench, draft_dir, cfg.target, models=Path(cfg.paths.root) / "models",
                       prompts=prompts, out=out, reporter=reporter, predicted=predicted, predicted_key=predicted_key,
                       on_measured=lambda m: fsutil.atomic_write_json(out / "metrics_before_grid.json", m))
    except DraftAlarm as err:
        # the evidence stays on disk; no manifest, so the pipeline never treats the stage as done
        fsutil.atomic_write_json(out / "alarm.json", {"error": str(err), **err.details})
        reporter.tag("bench.alarm", "fail")
        raise
    context = {"draft_dir": str(draft_dir), "backend": cfg.serve.backend, "predicted_key": predicted_key}
    if result.warnings:
        reporter.tag("bench.alarm", "warn")
        fsutil.atomic_write_json(out / "alarm.json", {"warnings": result.warnings, **context,
                                                      "metrics": result.metrics})
    _write(result, context, out, reporter)
    return result.metrics


def _write(result: BenchResult, context: dict, out: Path, reporter: Reporter) -> None:
    """per_prompt.json, metrics.json and, last, manifest.json (the stage's mark of completion)."""
    metrics, table = result.metrics, out / "per_prompt.json"
    fsutil.atomic_write_json(table, {"sets": result.sets, "rows": result.rows})
    for path in [*result.artifacts, table]:
        reporter.artifact(path)
    reporter.metrics(metrics)
    fsutil.atomic_write_json(out / "metrics.json", metrics)
    prompts = {n: metrics[f"bench/{s}/prompts"] for n, s in zip(result.sets, result.shown)}
    fsutil.atomic_write_json(out / "manifest.json", {
        "format": FORMAT, "backend": context["backend"], "draft_dir": context["draft_dir"], "sets": result.sets,
        "predicted_key": context["predicted_key"], "prompts": prompts, "metrics": metrics, "complete": True})
