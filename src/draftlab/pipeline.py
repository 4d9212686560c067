"""The stage registry and the content-addressed cache that makes `src/run.py` recompute only what changed.

Each stage's folder is `paths.root/<stage>/<key>/`, where the key is a fingerprint of the config values the
stage reads plus its inputs' keys, so parallel jobs of a sweep never collide and equal work is done once.
Incremental stages (generate, extract) leave `data.samples` out of their folder key: the folder is a pool that
grows, and a finished request is remembered by a completion record keyed by the full key.
"""

from __future__ import annotations

import importlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from draftlab.fsutil import atomic_write_json, file_lock, read_json
from draftlab.provenance import fingerprint
from draftlab.reporting import Reporter

log = logging.getLogger("draftlab.pipeline")


@dataclass(frozen=True)
class StageSpec:
    name: str
    reads: tuple[str, ...]  # config keys (or whole sections) that determine the output
    needs: tuple[str, ...] = ()  # upstream stages, in order
    grows_with: tuple[str, ...] = ()  # keys an incremental pool serves from the same folder

    @property
    def incremental(self) -> bool:
        return bool(self.grows_with)


_TARGET = ("target.name", "target.path", "target.gguf_file", "target.dtype", "target.tiny")
_PROMPTS = ("data.source", "data.path", "data.seed", "data.val_fraction", "data.max_prompt_tokens")

STAGES: dict[str, StageSpec] = {
    "generate": StageSpec("generate", _TARGET + _PROMPTS + (
        "data.max_new_tokens", "data.temperature", "data.batch_size"), grows_with=("data.samples",)),
    "extract": StageSpec("extract", _TARGET + ("extract.layers", "extract.dtype", "extract.mode"),
                         needs=("generate",), grows_with=("data.samples", "draft.vocab_size")),
    "train": StageSpec("train", ("data.samples", "draft", "train", "serve.num_steps"), needs=("generate", "extract")),
    "bench": StageSpec("bench", _TARGET + _PROMPTS + ("serve", "bench"), needs=("generate", "train")),
}
# Settings that change how fast, not what: they never split a cache.
NOT_FINGERPRINTED = {"train.log_every", "train.device", "train.strategy", "serve.host", "serve.port", "serve.python"}


@dataclass
class PlannedStage:
    spec: StageSpec
    folder: Path
    folder_key: str  # what the folder holds: the stage's settings and its inputs' folders
    key: str  # full key: folder key + grows_with values + inputs' full keys

    @property
    def done_record(self) -> Path:
        return self.folder / ".done" / f"{self.key[:16]}.json"


def _values(cfg, keys: tuple[str, ...]) -> dict:
    values = {}
    for key in keys:
        node = OmegaConf.select(cfg, key, throw_on_missing=True)
        values[key] = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
        if isinstance(values[key], dict):
            values[key] = {k: v for k, v in values[key].items() if f"{key}.{k}" not in NOT_FINGERPRINTED}
    return values


def plan(cfg) -> dict[str, PlannedStage]:
    """Folders and keys of every stage for this config (cheap: no file is touched)."""
    root = Path(cfg.paths.root)
    planned: dict[str, PlannedStage] = {}
    for name, spec in STAGES.items():
        upstream = {up: (planned[up].folder.name if STAGES[up].incremental else planned[up].key) for up in spec.needs}
        upstream_full = {up: planned[up].key for up in spec.needs}
        folder_key = fingerprint({"stage": name, "reads": _values(cfg, spec.reads), "inputs": upstream})
        full_key = fingerprint({"folder": folder_key, "grows": _values(cfg, spec.grows_with), "inputs": upstream_full})
        planned[name] = PlannedStage(spec, root / name / folder_key[:16], folder_key[:16], full_key)
    return planned


def run_stages(cfg, reporter: Reporter, names: list[str] | None = None) -> dict[str, float]:
    """Runs the requested stages in order, skipping those already done; returns every stage's metrics."""
    wanted = [n for n in STAGES if n in (names or cfg.stages)]
    planned = plan(cfg)
    results: dict[str, float] = {}
    for name in wanted:
        stage = planned[name]
        inputs = {up: planned[up].folder for up in stage.spec.needs}
        for up in stage.spec.needs:
            if up not in wanted and not planned[up].done_record.exists():
                raise RuntimeError(f"stage {name} needs {up} output {planned[up].folder}, which is not complete: "
                                   f"run with stages=[{up},{name}] or all stages")
        metrics = run_stage(_continuation(cfg) if name == "train" else cfg, stage, inputs, reporter)
        reporter.tag(f"fingerprint.{name}", stage.key)
        reporter.tag(f"folder.{name}", str(stage.folder))
        results.update(metrics)
    return results


def _with(cfg, key: str, value):
    copy = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    OmegaConf.update(copy, key, value)
    OmegaConf.set_readonly(copy, True)
    return copy


def _continuation(cfg):
    """`train.init_from: shorter` (the epochs sweep): continue from the longest finished run of the same
    config with fewer epochs. The folder key keeps the word "shorter", so the choice never splits a cache."""
    if cfg.train.init_from != "shorter":
        return cfg
    for epochs in range(cfg.train.epochs - 1, 0, -1):
        shorter = plan(_with(cfg, "train.epochs", epochs))["train"]
        if shorter.done_record.exists():
            log.info("train: continuing from the %d-epoch run in %s", epochs, shorter.folder)
            return _with(cfg, "train.init_from", str(shorter.folder))
    return _with(cfg, "train.init_from", None)


def run_stage(cfg, stage: PlannedStage, inputs: dict[str, Path], reporter: Reporter) -> dict[str, float]:
    name = stage.spec.name
    cached = read_json(stage.done_record)
    if cached is None:
        stage.folder.mkdir(parents=True, exist_ok=True)
        with file_lock(stage.folder.with_suffix(".lock")):  # a parallel job doing the same work waits here
            cached = read_json(stage.done_record)
            if cached is None:
                log.info("stage %s: running in %s", name, stage.folder)
                started = time.perf_counter()
                module = importlib.import_module(f"draftlab.stages.{name}")
                metrics = dict(module.run(cfg, stage.folder, inputs, reporter))
                metrics[f"{name}/seconds"] = time.perf_counter() - started
                metrics[f"{name}/cached"] = float(metrics.get(f"{name}/new_samples", 1) == 0)
                atomic_write_json(stage.done_record, metrics)
                if not stage.spec.incremental:
                    atomic_write_json(stage.folder / "metrics.json", metrics)
                reporter.metrics(metrics, step=final_step(metrics))
                return metrics
    log.info("stage %s: cached in %s, skipped", name, stage.folder)
    metrics = {**cached, f"{name}/cached": 1.0, f"{name}/seconds": 0.0}
    reporter.metrics(metrics, step=final_step(metrics))
    return metrics


def final_step(metrics: dict) -> int:
    """A stage's summary lands at its last optimizer step, so it extends the curves instead of adding a
    point at step 0 to them."""
    return int(metrics.get("train/steps", 0))
