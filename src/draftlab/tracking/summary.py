"""The table a run ends with: what came out, what it cost, what went wrong, where to look next.

A job ends with its key metrics (not with a "stage bench: running in ..." line and every result in MLflow), each
stage's seconds and cache state, every warning the run raised, the draft folder and the exact command that opens
MLflow on it; a sweep ends with one row per job and the verdict.
Rendered by rich as plain text, so the same table reads well on a console and in Hydra's run.log.
"""

from __future__ import annotations

import contextlib
import io
import logging
import shlex
import sys
from pathlib import Path
from typing import Iterator

from draftlab.config.config import STAGE_NAMES

# (label, metric names tried in order): the exported draft is the best epoch's, so its numbers come first
KEY_METRICS = (
    ("val/loss", ("best/val_loss", "val/loss")),
    ("acc_0 (val)", ("best/val_acc_0", "val/acc_0")),
    ("predicted tau", ("best/predicted_tau", "val/predicted_tau", "bench/predicted_tau")),
    ("bench tau", ("bench/tau",)),
    ("speed-up", ("bench/speedup",)),
)


class WarningCollector(logging.Handler):
    """Keeps every WARNING (and worse) that draftlab logs while a job runs, for the summary; loggers named in
    `exclude` (and their children) are left out."""

    def __init__(self, exclude: tuple[str, ...] = ()) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []
        self.exclude = exclude

    def emit(self, record: logging.LogRecord) -> None:
        if any(record.name == name or record.name.startswith(name + ".") for name in self.exclude):
            return
        message = record.getMessage()
        if message not in self.messages:
            self.messages.append(message)


@contextlib.contextmanager
def collect_warnings(logger_name: str = "draftlab", exclude: tuple[str, ...] = ()) -> Iterator[WarningCollector]:
    collector = WarningCollector(exclude)
    logger = logging.getLogger(logger_name)
    logger.addHandler(collector)
    try:
        yield collector
    finally:
        logger.removeHandler(collector)


# What a stage's completion record keeps of its warnings: the store's troubles are the job's, not the outputs'.
STAGE_WARNINGS_EXCLUDE = ("draftlab.tracking.runs",)
MAX_STAGE_WARNINGS = 20  # a flaky generation server's retries must not fill every later summary


def stage_warnings(collector: WarningCollector) -> list[str]:
    """The warnings a stage raised, as its completion record keeps them for the jobs that reuse it."""
    kept = collector.messages[:MAX_STAGE_WARNINGS]
    more = len(collector.messages) - len(kept)
    note = f"... and {more} more warnings (the job that ran the stage has them in its run.log)"
    return kept + ([note] if more else [])


def repeat_stage_warnings(log: logging.Logger, stage: str, record: dict) -> None:
    """A cached stage's warnings, raised again so the reusing job's summary shows them (a weak draft stays weak)."""
    for message in record.get("warnings", []):
        log.warning("%s [repeated from the cached %s stage, produced by commit %s]", message, stage,
                    record.get("produced_by", "unknown"))


def mlflow_ui_command(uri: str) -> str:
    """The command that opens MLflow on this store (local only, one worker: enough for one user)."""
    if uri.startswith(("http://", "https://")):
        return f"open {uri} in a browser (the store is an MLflow server)"
    exe = Path(sys.executable).with_name("mlflow")
    if exe.exists():
        try:
            exe = exe.relative_to(Path.cwd())  # .venv/bin/mlflow reads better than /long/path/.venv/bin/mlflow
        except ValueError:
            pass
    else:
        exe = Path("mlflow")
    return shlex.join([str(exe), "ui", "--backend-store-uri", uri, "--host", "127.0.0.1", "--port", "5000",
                       "--workers", "1"])


# MLflow 3.17's sidebar has a global GenAI / Model-training switch that a fresh browser keeps on GenAI, and it
# wins over the experiment's kind tag on first load; the URL parameter opens the model-training view directly.
TRAINING_VIEW = "workflowType=machine_learning"


def run_url(experiment_id: str | None, run_id: str | None, uri: str) -> str | None:
    """The run's page in the UI (model-training view); None without ids."""
    if not run_id or not experiment_id:
        return None
    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}?{TRAINING_VIEW}"


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _first(metrics: dict, names: tuple[str, ...]):
    return next((metrics[n] for n in names if n in metrics), None)


def _render(*tables) -> str:
    from rich.console import Console

    buffer = io.StringIO()
    console = Console(file=buffer, width=110, color_system=None, force_terminal=False, soft_wrap=False)
    for table in tables:
        console.print(table)
    return buffer.getvalue().rstrip()


def training_state(metrics: dict) -> str:
    """Whether the draft trained to convergence: a capped run must never read as a converged one."""
    steps = f"{metrics['train/steps']:.0f} steps"
    converged = metrics.get("train/converged")
    if converged == 1.0:
        return f"converged (val/loss plateau), {steps}"
    if converged == 0.0:
        return f"NOT converged: the budget ran out at {steps} before a val/loss plateau"
    return f"{steps}, a fixed budget (no early stopping)"


def _steps_cell(metrics: dict) -> str:
    if "train/steps" not in metrics:
        return "-"
    return f"{metrics['train/steps']:.0f}" + (" cap" if metrics.get("train/converged") == 0.0 else "")


def bench_set_names(metrics: dict) -> list[str]:
    """The bench sets a run measured, in the order it logged them (each has bench/<set>/tau_lo)."""
    return [k.split("/")[1] for k in metrics if k.startswith("bench/") and k.endswith("/tau_lo") and k.count("/") == 2]


def sglang_set_names(metrics: dict) -> list[str]:
    """The bench sets SGLang served (each has bench/sglang/<set>/tau_lo)."""
    return [k.split("/")[2] for k in metrics
            if k.startswith("bench/sglang/") and k.endswith("/tau_lo") and k.count("/") == 3]


def _set_line(name: str, metrics: dict) -> str:
    from draftlab.stats.intervals import tau_line

    line, p = tau_line(name, metrics), f"bench/{name}"
    if f"{p}/speedup" in metrics:
        low, high = metrics.get(f"{p}/speedup_lo", float("nan")), metrics.get(f"{p}/speedup_hi", float("nan"))
        line += f"; speed-up {metrics[f'{p}/speedup']:.3g}x (95% {low:.3g}-{high:.3g})"
    if f"{p}/tau_gap" in metrics:
        line += (f"; minus the local engine's tau: {metrics[f'{p}/tau_gap']:+.3g} (95% {metrics[f'{p}/tau_gap_lo']:+.3g}"
                 f" to {metrics[f'{p}/tau_gap_hi']:+.3g})")
    return line


def bench_rows(metrics: dict) -> list[tuple[str, str]]:
    """Each set's tau with its interval (and whether it decides anything) and speed-up, per engine; the speed-up
    per batch size; SGLang's best serving setting. Beside SGLang, the local engine's rows say whose they are."""
    rows, served = [], sglang_set_names(metrics)
    local = " (local engine)" if served else ""
    for name in bench_set_names(metrics):
        rows.append((f"bench {name}{local}", _set_line(name, metrics)))
        p = f"bench/{name}"
        if f"{p}/tf_tau" in metrics:
            rows.append(("  same answers", f"training's count {metrics[f'{p}/tf_tau']:.3g}, deployment's "
                                            f"{metrics[f'{p}/walk_tau']:.3g} (teacher-forced)"))
    for name in served:
        rows.append((f"bench {name} (SGLang)", _set_line(f"sglang/{name}", metrics)))
    sizes = sorted(int(k.split("/")[1][2:]) for k in metrics
                   if k.startswith("bench/bs") and k.endswith("/speedup") and k.split("/")[1][2:].isdigit())
    if sizes:
        rows.append(("speed-up by batch" + (" (SGLang)" if served else ""),
                     ", ".join(f"bs{b} {metrics[f'bench/bs{b}/speedup']:.3g}x" for b in sizes)))
    if "bench/speedup_bound" in metrics:  # serve/step_costs.py
        m = metrics
        rows.append((f"speed-up bound{local}", f"{m['bench/speedup_bound']:.3g}x; "
                                               f"{m.get('bench/speedup_bound_with_verify', float('nan')):.3g}x with the"
                                               f" verify (draft {m['bench/draft_step_ms']:.3g}, target "
                                               f"{m['bench/target_step_ms']:.3g} ms); reached "
                                               f"{100 * m['bench/speedup_of_bound']:.0f}%"))
    if "bench/sglang/grid_best/steps" in metrics:  # sglang/grid.py
        rows.append(("SGLang best setting", _grid_line(metrics)))
    return rows


def _grid_line(m: dict) -> str:
    from draftlab.sglang.grid import launch_flags

    best = "bench/sglang/grid_best"
    setting = tuple(int(m[f"{best}/{k}"]) for k in ("steps", "topk", "num_draft_tokens"))
    line = f"{launch_flags(setting)}: speed-up {m[f'{best}/speedup']:.3g}x at tau {m[f'{best}/tau']:.3g}"
    if f"{best}/speedup_of_bound" in m:
        line += f", {100 * m[f'{best}/speedup_of_bound']:.0f}% of the {m[f'{best}/speedup_bound']:.3g}x its step costs allow"
    return line


def _ms(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"  # a busy host's 1550 ms, not 1.55e+03


def slow_bench_reason(metrics: dict, tags: dict) -> str | None:
    """One line for a CPU bench whose speed-up is below 1x: a first run must not read as a broken engine. The
    local engine's bound, tau / (1 + k x draft step / target step), says how much the step costs leave; k is
    read back from that bound (serve/step_costs.py). None on a GPU, at 1x or more, or without step costs."""
    needed = ("bench/speedup", "bench/tau", "bench/speedup_bound", "bench/draft_step_ms", "bench/target_step_ms")
    if tags.get("bench/produced_on") != "cpu" or not all(k in metrics for k in needed):
        return None
    tau, bound = metrics["bench/tau"], metrics["bench/speedup_bound"]
    draft, target = metrics["bench/draft_step_ms"], metrics["bench/target_step_ms"]
    if not metrics["bench/speedup"] < 1.0 or not bound > 0 or not draft > 0:
        return None
    k = round((tau / bound - 1.0) * target / draft)
    costs = (f"tau {tau:.3g} / (1 + {k} draft steps x {_ms(draft)} ms / a {_ms(target)} ms target step) = "
             f"{bound:.3g}x")
    why = (f"the step costs allow at most {costs}" if bound < 1.0 else
           f"the step costs allow {costs}, of which the engine reached {100 * metrics['bench/speedup'] / bound:.0f}%:"
           f" the rest is its work beyond those steps (prefills, host bookkeeping), large on a busy CPU")
    return f"{why}; a GPU run: BENCHMARKS.md, \"Speculative-decoding speed-up\""


def job_summary(metrics: dict, tags: dict, warnings: list[str], uri: str | None, run_id: str | None = None,
                experiment_id: str | None = None, results_file: Path | None = None, stages=STAGE_NAMES) -> str:
    """The end-of-job table: key metrics, stages, warnings, where the draft and the run are."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="draftlab: run summary", show_header=False, title_justify="left", expand=False)
    table.add_column("what", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    for label, names in KEY_METRICS:
        table.add_row(label, _fmt(_first(metrics, names)))
    for label, value in bench_rows(metrics):
        table.add_row(label, value)
    why = slow_bench_reason(metrics, tags)
    if why:
        table.add_row("why below 1x", why)
    if "train/steps" in metrics:
        table.add_row("training", training_state(metrics))
    for stage in stages:
        if f"{stage}/seconds" not in metrics:
            continue
        cached = metrics.get(f"{stage}/cached") == 1.0
        table.add_row(f"{stage}", f"{metrics[f'{stage}/seconds']:.1f} s" + (" (cached)" if cached else ""))
    # escaped: rich reads "[word ...]" as markup and would drop it from a warning
    table.add_row("warnings", escape("\n".join(f"- {w}" for w in warnings)) if warnings else "none")
    if tags.get("draft_dir") or tags.get("folder.train"):
        table.add_row("draft folder", tags.get("draft_dir") or str(Path(tags["folder.train"]) / "draft"))
    if results_file is not None:
        table.add_row("results", str(results_file))
    if not uri:
        table.add_row("MLflow", "tracking.enabled=false: log this job later with python -m draftlab import-runs")
    return _render(table) + _where_to_look(uri, run_url(experiment_id, run_id, uri) if uri else None, "this run")


def _where_to_look(uri: str | None, url: str | None, what: str) -> str:
    """The MLflow command on a line of its own, outside the box, so that it copies and pastes whole."""
    if not uri:
        return ""
    lines = ["", "Open MLflow:", f"  {mlflow_ui_command(uri)}"]
    if url:
        lines.append(f"  then {what}: {url}")
        lines.append(f"  or all runs: {url.split('/runs/')[0]}/runs?{TRAINING_VIEW}")
    return "\n".join(lines)


SWEEP_COLUMNS = (("val/loss", ("best/val_loss", "val/loss")), ("acc_0", ("best/val_acc_0", "val/acc_0")),
                 ("pred. tau", ("best/predicted_tau", "val/predicted_tau")), ("bench tau", ("bench/tau",)),
                 ("speed-up", ("bench/speedup",)))


def sweep_summary(jobs: list[tuple[str, dict]], verdict: str | None, uri: str | None,
                  parent_run_id: str | None = None, experiment_id: str | None = None) -> str:
    """One row per job (its run name and key metrics, seconds of real work), then the verdict."""
    from rich.markup import escape
    from rich.table import Table

    rows = Table(title=f"draftlab: sweep summary ({len(jobs)} jobs)", title_justify="left")
    rows.add_column("job", overflow="fold")
    for label, _ in SWEEP_COLUMNS:
        rows.add_column(label, justify="right")
    rows.add_column("steps", justify="right")  # "cap": early stopping was on, and the budget ran out first
    rows.add_column("seconds", justify="right")
    for name, metrics in jobs:
        seconds = sum(metrics.get(f"{s}/seconds", 0.0) for s in STAGE_NAMES)
        rows.add_row(escape(name), *(_fmt(_first(metrics, names)) for _, names in SWEEP_COLUMNS),
                     _steps_cell(metrics), f"{seconds:.0f}")
    footer = Table(show_header=False, expand=False)
    footer.add_column("what", style="bold", no_wrap=True)
    footer.add_column("value", overflow="fold")
    footer.add_row("verdict", verdict or "no analysis (see the log above)")
    return _render(rows, footer) + _where_to_look(uri, run_url(experiment_id, parent_run_id, uri) if uri else None,
                                                  "the sweep's parent run")
