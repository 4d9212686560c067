"""Stage `bench`: deployed acceptance and speed of the trained draft on held-out prompts.

Inputs: `generate` (samples; the val split is never trained on) and `train` (`draft/` and `metrics.json`).
`serve.backend`: `local` loads the draft as SGLang would (serve/loader.py) and serves it with the local engine, on
static KV caches with CUDA graphs or not as `bench.static_cache` / `bench.cuda_graphs` say (serve/modes.py);
`sglang` launches the real SGLang server (sglang/bench.py); `both` runs SGLang first, then the local engine at batch
size 1 on the same prompts, and reports the gap (serve/engine_gap.py). The predicted-vs-deployed alarm
(serve/alarm.py) reads the deployed engine, SGLang when it ran, and may raise `DraftAlarm`; a draft that passes it
then runs `bench.sglang_grid` (sglang/grid.py).

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

import gc
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftlab.util import fsutil
from draftlab.model.attention import variable_shape_attention
from draftlab.util.progress import bar_over
from draftlab.util.reporting import Reporter
from draftlab.serve import alarm, engine_gap, step_costs
from draftlab.serve.engine import Generation, SpecEngine, target_decode
from draftlab.serve.modes import DYNAMIC, EngineMode, engine_mode, graph_report, load_drafter, target_runner
from draftlab.serve.static_target import static_cache_obstacle
from draftlab.stages import bench_sets

log = logging.getLogger("draftlab")
FORMAT = "draftlab.bench/1"


@dataclass
class BenchRun:
    spec: list[Generation] = field(default_factory=list)
    base: list[Generation] = field(default_factory=list)
    graphs: dict = field(default_factory=dict)  # fixed-shape step -> graph | eager | why its capture failed
    step_ms: dict = field(default_factory=dict)  # serve/step_costs.py: each engine step on its own
    sync_free: bool = False  # whole cycles replayed with no host sync inside (serve/sync_free.py)


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


@variable_shape_attention()  # (a context manager, entered afresh on every call)
def measure(model, drafter, prompts: list[list[int]], num_steps: int, max_new_tokens: int,
            temperature: float, eos_token_ids, seed: int = 0, warmup: bool = True,
            mode: EngineMode = DYNAMIC, sync_free: bool | None = None) -> BenchRun:
    """Speculative and plain decoding of every prompt, alternating which goes first; both decoders use `mode`'s
    KV cache (and CUDA graphs), sized once for the longest prompt so every step keeps one shape. Every prompt's
    prefill has another length, so the whole measurement keeps out of cuDNN's attention, which plans each new shape
    on the host (model/attention.py): those plans would be timed, and would depend on what the process ran before.
    sync_free (default: with CUDA graphs and greedy decoding): both decoders replay whole cycles with no host sync
    inside (serve/sync_free.py); on a CPU every op is synchronous anyway, so that only adds the EOS overshoot."""
    from draftlab.serve.sync_free import SyncFreePlain, SyncFreeSpec

    layers = tuple(getattr(drafter, "feature_layers", ()))
    engine = SpecEngine(model, drafter, num_steps, eos_token_ids, runner=target_runner(model, mode, layers))
    if sync_free is None:
        sync_free = mode.cuda_graphs and temperature <= 0
    decoder = SyncFreeSpec(engine) if sync_free else engine
    # sized before the warm-up, so no step is captured again mid-measurement
    longest = decoder.reserve(max(len(p) for p in prompts), max_new_tokens)
    runner = target_runner(model, mode, (), longest)
    plain = SyncFreePlain(runner) if sync_free else None
    device = runner.device
    gen = torch.Generator(device=device)

    def seeded(i):  # each prompt its own stream, the same for both decoders; None when greedy
        return gen.manual_seed(seed + i) if temperature > 0 else None

    def spec(ids, n, i):
        return decoder.generate(ids, n, temperature, seeded(i))

    def base(ids, n, i):
        if plain is not None:
            return plain.generate(ids, n, eos_token_ids)
        return target_decode(model, ids, n, eos_token_ids, temperature, seeded(i), runner=runner)

    if warmup:  # first-call allocations, kernel selection and graph captures stay out of the timings
        n = min(2 * (num_steps + 1) + 2, max_new_tokens)  # two cycles at least, even if every draft is accepted
        eos, decoder.eos = decoder.eos, set()  # no early stop, so every step shape runs once
        spec(prompts[0], n, len(prompts))
        decoder.eos = eos
        if plain is not None:
            plain.generate(prompts[0], n, [])
        else:
            target_decode(model, prompts[0], n, [], temperature, seeded(len(prompts)), runner=runner)
    run = BenchRun(sync_free=sync_free)
    for i, ids in enumerate(bar_over(prompts, "bench", "prompt")):
        if i % 2 == 0:
            run.spec.append(spec(ids, max_new_tokens, i))
            run.base.append(base(ids, max_new_tokens, i))
        else:
            run.base.append(base(ids, max_new_tokens, i))
            run.spec.append(spec(ids, max_new_tokens, i))
    if mode.static_cache:  # timed halfway through the measured answers
        position = sum(g.prompt_len + len(g.tokens) // 2 for g in run.spec) // max(len(run.spec), 1)
        run.step_ms = step_costs.measure(engine.target, engine.drafter, runner, num_steps, position)
    run.graphs = graph_report(engine.target, engine.drafter, runner, decoder, plain)
    # the runners' step closures refer back to them, so their KV caches and graphs would outlive this call until
    # the collector happened to run (spec_decode.py measures many modes in one process)
    del engine, decoder, runner, plain, spec, base
    gc.collect()
    return run


def summarize(run: BenchRun, num_steps: int, temperature: float) -> dict[str, float]:
    tokens = sum(len(g.tokens) for g in run.spec)
    steps = sum(g.verify_steps for g in run.spec)
    accepted = [a for g in run.spec for a in g.accepted]
    spec_s = sum(g.seconds for g in run.spec)
    base_tokens, base_s = sum(len(g.tokens) for g in run.base), sum(g.seconds for g in run.base)
    m = {
        "bench/tau": tokens / steps if steps else float("nan"),
        "bench/verify_steps": float(steps),
        "bench/tokens": float(tokens),
        "bench/prompts": float(len(run.spec)),
        "bench/mean_accepted": sum(accepted) / len(accepted) if accepted else 0.0,
        # per verify step, bonus included, prefill token excluded: SGLang's server-level accept length
        "bench/accept_length": 1 + sum(accepted) / len(accepted) if accepted else float("nan"),
        "bench/tokens_per_s": tokens / spec_s if spec_s > 0 else float("nan"),
        "bench/baseline_tokens_per_s": base_tokens / base_s if base_s > 0 else float("nan"),
        "bench/cycle_ms": 1000 * spec_s / steps if steps else float("nan"),  # prefills included
    }
    m["bench/speedup"] = m["bench/tokens_per_s"] / m["bench/baseline_tokens_per_s"]
    for j in range(num_steps):
        m[f"bench/accept_rate_{j}"] = sum(a > j for a in accepted) / len(accepted) if accepted else 0.0
    if temperature <= 0:  # greedy must reproduce the target; bf16 near-ties may flip a token, so it is reported
        same = sum(s.tokens == b.tokens for s, b in zip(run.spec, run.base))
        m["bench/greedy_match_frac"] = same / len(run.spec)
    return m


def write_histogram(run: BenchRun, num_steps: int, out: Path) -> tuple[Path, Path]:
    """Accept length per verify step (accepted drafts + bonus, 1..k+1), as JSON and a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = list(range(1, num_steps + 2))
    counts = [0] * len(lengths)
    for g in run.spec:
        for a in g.accepted:
            counts[a] += 1
    js = out / "accept_hist.json"
    fsutil.atomic_write_json(js, {"accept_length": lengths, "count": counts,
                                  "note": "tokens committed per verify step, bonus included, before truncation"})
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.bar(lengths, counts)
    ax.set_xlabel("accept length (drafts accepted + bonus)")
    ax.set_ylabel("verify steps")
    total = sum(counts)
    mean = sum(length * c for length, c in zip(lengths, counts)) / total if total else 0.0
    ax.set_title(f"num_steps={num_steps}, mean accept length {mean:.2f}")
    fig.tight_layout()
    png = out / "accept_hist.png"
    with fsutil.atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return js, png


def serve_dtype(spec: str, target_dtype: torch.dtype) -> torch.dtype:
    return target_dtype if spec == "auto" else getattr(torch, spec)


def _run_local(cfg, sets, texts, samples: Path, draft_dir: Path, out: Path, batches: bool = True):
    """(metrics, draft problems, per-prompt rows, set names): every set measured in one engine (one warm-up,
    one set of graph captures), then each batch size above 1 on the first set's prompts (unless `batches` is
    false: beside SGLang, concurrent requests are SGLang's to measure)."""
    from draftlab.serve.batch_bench import batch_one_metrics, measure_batch_size
    from draftlab.target.target import load_target

    target = load_target(cfg.target, Path(cfg.paths.root) / "models")
    prompts = bench_sets.tokenize(cfg, sets, texts, samples, target.tokenizer, held_out_prompts)
    if cfg.serve.topk != 1:
        log.warning("bench: the local engine drafts a chain (topk 1); serve.topk=%d is ignored", cfg.serve.topk)
    mode = engine_mode(cfg.bench.static_cache, cfg.bench.cuda_graphs, target.device, target.model)
    drafter, loaded = load_drafter(draft_dir, target.model, mode, cfg.serve.sglang_rules,
                                   serve_dtype(cfg.serve.dtype, target.dtype))
    problems = loaded.problems()
    k, bench = cfg.serve.num_steps, cfg.bench
    torch.manual_seed(bench.seed)
    names = list(prompts)
    run = measure(target.model, drafter, [p for n in names for p in prompts[n]], k, bench.max_new_tokens,
                  bench.temperature, target.eos_token_ids, bench.seed, mode=mode)
    if mode.cuda_graphs:
        log.info("bench: engine steps (%s): %s", mode.name, run.graphs)
    sizes = [len(prompts[n]) for n in names]
    runs = [BenchRun(spec, base) for spec, base in zip(bench_sets.split(run.spec, sizes),
                                                       bench_sets.split(run.base, sizes))]
    summaries = [summarize(part, k, bench.temperature) for part in runs]
    metrics = dict(summaries[0])  # bench/tau, bench/speedup, ...: the first set's
    rows = []
    for name, part, summary in zip(names, runs, summaries):
        set_rows = bench_sets.per_prompt_rows(name, part.spec, part.base)
        metrics.update(bench_sets.metrics_of_set(name, set_rows, summary, k, bench.seed))
        if bench.temperature <= 0:  # the same prompts and positions, by training's count and by deployment's
            metrics.update(bench_sets.teacher_forced(name, set_rows, prompts[name], part.base, target.model,
                                                     drafter, k))
        rows += set_rows
    metrics.update(batch_one_metrics(metrics, names[0]))
    metrics["bench/sync_free"] = float(run.sync_free)
    if run.step_ms:  # the bound the measured step costs allow, beside the speed-up reached (first set)
        metrics.update({f"bench/{name}": ms for name, ms in run.step_ms.items()})
        metrics["bench/speedup_bound"] = step_costs.bound(metrics["bench/tau"], k, run.step_ms)
        metrics["bench/speedup_of_bound"] = metrics["bench/speedup"] / metrics["bench/speedup_bound"]
        metrics["bench/speedup_bound_with_verify"] = step_costs.bound_with_verify(metrics["bench/tau"], k, run.step_ms)
        log.info("bench: speed-up %.2fx, %.0f%% of the bound %.2fx = tau %.2f / (1 + %d x %.3f ms draft step / "
                 "%.3f ms target step); %.2fx with the verify step as measured (%.3f ms)", metrics["bench/speedup"],
                 100 * metrics["bench/speedup_of_bound"], metrics["bench/speedup_bound"], metrics["bench/tau"], k,
                 run.step_ms["draft_step_ms"], run.step_ms["target_step_ms"],
                 metrics["bench/speedup_bound_with_verify"], run.step_ms["verify_step_ms"])
    larger = [b for b in bench.batch_sizes if b > 1] if batches else []
    obstacle = static_cache_obstacle(target.model.config)
    if larger and obstacle:  # the batched engine writes each row into a preallocated static cache
        log.warning("bench: batch sizes %s skipped: %s, and the batched engine needs the static KV cache", larger,
                    obstacle)
        larger = []
    if larger and mode.cuda_graphs:
        log.info("bench: batch sizes %s run eagerly (the batched engine has no CUDA graphs yet); batch size 1 "
                 "keeps them", larger)
    for size in larger:
        metrics.update(measure_batch_size(target.model, drafter, prompts[names[0]], size, k, bench.max_new_tokens,
                                          bench.temperature, target.eos_token_ids, bench.seed))
    lines = [json.dumps({"set": r["set"], "prompt": r["prompt"], "tau": s.tau, "accepted": s.accepted,
                         "tokens": s.tokens, "baseline_tokens": b.tokens, "spec_s": s.seconds, "base_s": b.seconds})
             for r, s, b in zip(rows, run.spec, run.base)]
    fsutil.atomic_write_text(out / "generations.jsonl", "\n".join(lines) + "\n")  # for eyeballing
    return metrics, problems, rows, names, runs[0]  # the histogram is the first set's, as bench/tau is


def _run_sglang(cfg, sets, texts, samples: Path, draft_dir: Path, out: Path, reporter):
    from draftlab.sglang.bench import run_sglang_bench
    from draftlab.sglang.keymap import load_like_sglang
    from draftlab.target.target import load_target, load_tokenizer, serving_path

    models = Path(cfg.paths.root) / "models"
    tokenizer = load_tokenizer(cfg.target, models) or load_target(cfg.target, models).tokenizer
    prompts = bench_sets.tokenize(cfg, sets, texts, samples, tokenizer, held_out_prompts)
    target_path = serving_path(cfg.target, models)
    metrics, rows = run_sglang_bench(cfg, target_path, draft_dir, prompts, out, reporter)
    problems = load_like_sglang(draft_dir, cfg.serve.sglang_rules)[1].lines()
    return dict(metrics), problems, [{"engine": "sglang", **r} for r in rows], prompts


def _grid(cfg, prompts: list, draft_dir: Path, rows, first: str, out: Path, reporter) -> dict:
    """bench.sglang_grid (sglang/grid.py) on the first set's prompts, last: the engines' own numbers are kept
    whatever happens to it."""
    if not cfg.bench.sglang_grid:
        return {}
    from draftlab.sglang.grid import run_grid
    from draftlab.target.target import serving_path

    models = Path(cfg.paths.root) / "models"
    base_rows = [r for r in rows if r.get("engine") == "sglang" and r["set"] == first]
    draft = out / "draft-sglang" if (out / "draft-sglang").is_dir() else draft_dir  # as the main bench served it
    return run_grid(cfg, serving_path(cfg.target, models), draft, prompts, base_rows, out, reporter)


def _figures(metrics: dict, names: list[str], predicted, cfg, out: Path) -> list[Path]:
    from draftlab.serve import bench_plots

    paths = [bench_plots.acceptance_by_position(metrics, names, cfg.serve.num_steps, out),
             bench_plots.tau_by_set(metrics, names, predicted, out),
             bench_plots.speedup_by_batch(metrics, list(cfg.bench.batch_sizes), out)]
    return [p for p in paths if p is not None]


def run(cfg, out: Path, inputs: dict[str, Path], reporter: Reporter) -> dict[str, float]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    train_dir = Path(inputs["train"])
    draft_dir = train_dir / "draft"
    if not (draft_dir / "config.json").exists():
        raise FileNotFoundError(f"{draft_dir}: no exported draft (did the train stage finish?)")
    predicted, predicted_key = alarm.read_predicted_tau(train_dir)
    sets, texts = bench_sets.read_texts(cfg)  # a bad prompt file fails here, before any model loads

    backend, run, metrics, rows, problems = cfg.serve.backend, None, {}, [], []
    if backend in ("sglang", "both"):  # first: the deployed numbers, on a GPU this process has not filled yet
        metrics, problems, rows, served = _run_sglang(cfg, sets, texts, inputs["generate"], draft_dir, out, reporter)
        names = list(served)
    if backend in ("local", "both"):
        local, problems, local_rows, names, run = _run_local(cfg, sets, texts, inputs["generate"], draft_dir, out,
                                                             batches=backend == "local")
        metrics = {**local, **metrics}
        for name in names if backend == "both" else ():
            metrics.update(engine_gap.tau_gap(name, [r for r in local_rows if r["set"] == name],
                                              [r for r in rows if r["set"] == name], cfg.bench.seed))
        rows = rows + [{"engine": "local", **r} for r in local_rows]
    if backend != "local":
        metrics.update(engine_gap.deployed_metrics(metrics, names[0]))
        fsutil.atomic_write_json(out / "metrics_before_grid.json", metrics)  # a grid cut short loses only its part
    shown = [f"sglang/{n}" for n in names] if backend == "sglang" else names  # the sets' bench/<shown>/ keys
    deployed = f"bench/{'sglang/' if backend != 'local' else ''}{names[0]}"
    bench_sets.warn_if_undecidable(shown, metrics)

    context = {"draft_dir": str(draft_dir), "backend": cfg.serve.backend, "predicted_key": predicted_key,
               "metrics": metrics}
    try:
        accept_length = metrics.get("bench/accept_length", metrics.get("bench/server_accept_length"))
        result = alarm.check(metrics["bench/tau"], predicted, cfg.bench, problems, context, accept_length,
                             tau_hi=metrics.get(f"{deployed}/tau_hi"))
    except alarm.DraftAlarm as err:
        # the evidence stays on disk; no manifest, so the pipeline never treats the stage as done
        fsutil.atomic_write_json(out / "alarm.json", {"error": str(err), **err.details})
        reporter.tag("bench.alarm", "fail")
        raise
    metrics.update(result.metrics)
    if backend != "local":  # only for a draft that passed the alarm: each setting is a server start
        metrics.update(_grid(cfg, served[names[0]], draft_dir, rows, names[0], out, reporter))
    if predicted is not None:
        metrics["bench/predicted_tau"] = predicted
    if result.warnings:
        reporter.tag("bench.alarm", "warn")
        fsutil.atomic_write_json(out / "alarm.json", {"warnings": result.warnings, **context})

    if run is not None:
        for path in write_histogram(run, cfg.serve.num_steps, out):
            reporter.artifact(path)
    table = out / "per_prompt.json"
    fsutil.atomic_write_json(table, {"sets": names, "rows": rows})
    for path in [table, *_figures(metrics, shown, predicted, cfg, out)]:
        reporter.artifact(path)
    reporter.metrics(metrics)
    fsutil.atomic_write_json(out / "metrics.json", metrics)
    fsutil.atomic_write_json(out / "manifest.json", {
        "format": FORMAT, "backend": cfg.serve.backend, "draft_dir": str(draft_dir), "sets": names,
        "predicted_key": predicted_key, "prompts": {n: metrics[f"bench/{s}/prompts"] for n, s in zip(names, shown)},
        "metrics": metrics, "complete": True})
    return metrics
