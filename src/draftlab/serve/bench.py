"""The bench stage's one entry into serving: `bench(serve, bench, draft, target, ...) -> BenchResult`, whatever
`serve.backend` says.

`local` measures the draft in the local engine (serve/local_bench.py); `sglang` in the real SGLang server
(sglang/bench.py); `both` runs SGLang first, on a GPU this process has not filled yet, then the local engine at
batch size 1 on the same prompts, and reports the gap (serve/engine_gap.py). When SGLang ran, its first set gives
the headline keys. The predicted-vs-deployed alarm (serve/alarm.py) then reads the deployed engine and may raise
`DraftAlarm`; a draft that passes it runs `bench.sglang_grid` (sglang/grid.py). Last come the figures
(serve/bench_plots.py). The stage writes the tables, metrics and manifest from the returned BenchResult.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from draftlab.serve import alarm, bench_plots, engine_gap
from draftlab.serve.alarm import DraftAlarm, read_predicted_tau  # noqa: F401 (the stage's names for the alarm)
from draftlab.serve.local_bench import run_local
from draftlab.serve.measure import EngineResult
from draftlab.serve.set_metrics import warn_if_undecidable


@dataclass
class BenchResult:
    metrics: dict[str, float]
    rows: list[dict]  # one per prompt and engine, with an `engine` column
    sets: list[str]  # the sets' names, in bench.sets order
    shown: list[str]  # each set's stem in its bench/<stem>/ keys (sglang/<set> when SGLang ran alone)
    problems: list[str] = field(default_factory=list)  # the draft as SGLang would load it
    warnings: list[str] = field(default_factory=list)  # the alarm's
    artifacts: list[Path] = field(default_factory=list)  # histogram and figures written into `out`


def bench(serve_cfg, bench_cfg, draft: Path, target, *, models: Path, prompts: Callable, out: Path, reporter,
          predicted: float | None = None, predicted_key: str | None = None,
          on_measured: Callable[[dict], None] | None = None) -> BenchResult:
    """Measures the draft folder `draft` against the target `target` (target config; weights under `models`) on
    `prompts(tokenizer)` (set name -> prompt ids), checks it against training's `predicted` tau, then runs the
    SGLang grid. `on_measured(metrics)` is called before the grid, so a grid cut short loses only its part.
    Engine files (server logs, sglang_bench.json, grid.json, generations.jsonl, figures) go into `out`."""
    out, backend = Path(out), serve_cfg.backend
    sglang = local = None
    if backend in ("sglang", "both"):
        sglang = _sglang_engine(serve_cfg, bench_cfg, draft, target, models, prompts, out, reporter)
    if backend in ("local", "both"):
        local = run_local(serve_cfg, bench_cfg, draft, target, models, prompts, out, batches=backend == "local")
    result = _combine(sglang, local, bench_cfg.seed)
    if sglang is not None and on_measured is not None:
        on_measured(result.metrics)
    warn_if_undecidable(result.shown, result.metrics)
    context = {"draft_dir": str(draft), "backend": backend, "predicted_key": predicted_key,
               "metrics": result.metrics}
    deployed = f"bench/{'sglang/' if sglang is not None else ''}{result.sets[0]}"
    _check(result, bench_cfg, predicted, context, deployed)
    if sglang is not None:  # only for a draft that passed the alarm: each setting is a server start
        result.metrics.update(_grid(serve_cfg, bench_cfg, target, models, draft, sglang, out, reporter))
    if predicted is not None:
        result.metrics["bench/predicted_tau"] = predicted
    if local is not None:
        result.artifacts += bench_plots.accept_histogram(local.first_spec, serve_cfg.num_steps, out)
    result.artifacts += _figures(result, predicted, serve_cfg.num_steps, list(bench_cfg.batch_sizes), out)
    return result


def _combine(sglang: EngineResult | None, local: EngineResult | None, seed: int) -> BenchResult:
    """Both engines' numbers in one table: SGLang's keys win where both report one, the gap between their tau
    per set, and the headline keys from SGLang's first set when it ran."""
    metrics, rows, problems = (sglang.metrics, sglang.rows, sglang.problems) if sglang else ({}, [], [])
    names = list((sglang or local).prompts)
    if local is not None:
        metrics, problems = {**local.metrics, **metrics}, local.problems
        for name in names if sglang is not None else ():
            metrics.update(engine_gap.tau_gap(name, [r for r in local.rows if r["set"] == name],
                                              [r for r in sglang.rows if r["set"] == name], seed))
        rows = rows + [{"engine": "local", **r} for r in local.rows]
    if sglang is not None:
        metrics.update(engine_gap.deployed_metrics(metrics, names[0]))
    shown = [f"sglang/{n}" for n in names] if local is None else names
    return BenchResult(metrics, rows, names, shown, problems)


def _check(result: BenchResult, bench_cfg, predicted: float | None, context: dict, deployed: str) -> None:
    """The alarm on the deployed engine's first set: raises DraftAlarm, or adds its ratios and warnings."""
    m = result.metrics
    accept_length = m.get("bench/accept_length", m.get("bench/server_accept_length"))
    checked = alarm.check(m["bench/tau"], predicted, bench_cfg, result.problems, context, accept_length,
                          tau_hi=m.get(f"{deployed}/tau_hi"))
    m.update(checked.metrics)
    result.warnings = checked.warnings


def _sglang_engine(serve_cfg, bench_cfg, draft: Path, target, models: Path, prompts: Callable, out: Path,
                   reporter) -> EngineResult:
    from draftlab.sglang import bench as sglang_bench
    from draftlab.sglang.keymap import load_like_sglang
    from draftlab.target.target import load_target, load_tokenizer, serving_path

    tokenizer = load_tokenizer(target, models) or load_target(target, models).tokenizer
    served = prompts(tokenizer)
    metrics, rows = sglang_bench.run_sglang_bench(serve_cfg, bench_cfg, serving_path(target, models), draft,
                                                  served, out, reporter)
    problems = load_like_sglang(draft, serve_cfg.sglang_rules)[1].lines()
    return EngineResult(dict(metrics), problems, [{"engine": "sglang", **r} for r in rows], served)


def _grid(serve_cfg, bench_cfg, target, models: Path, draft: Path, sglang: EngineResult, out: Path,
          reporter) -> dict:
    """bench.sglang_grid on the first set's prompts, last: the engines' own numbers are kept whatever happens
    to it."""
    if not bench_cfg.sglang_grid:
        return {}
    from draftlab.sglang.grid import run_grid
    from draftlab.target.target import serving_path

    first = next(iter(sglang.prompts))
    base_rows = [r for r in sglang.rows if r["set"] == first]
    served = out / "draft-sglang" if (out / "draft-sglang").is_dir() else draft  # as the main bench served it
    return run_grid(serve_cfg, bench_cfg, serving_path(target, models), served, sglang.prompts[first], base_rows,
                    out, reporter)


def _figures(result: BenchResult, predicted, num_steps: int, batch_sizes: list[int], out: Path) -> list[Path]:
    paths = [bench_plots.acceptance_by_position(result.metrics, result.shown, num_steps, out),
             bench_plots.tau_by_set(result.metrics, result.shown, predicted, out),
             bench_plots.speedup_by_batch(result.metrics, batch_sizes, out)]
    return [p for p in paths if p is not None]
