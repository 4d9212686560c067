"""The train stage: build the draft from the extract manifest, train it with TTT, export the best validation pass.

Reads `train.*`, `draft.*` and `serve.num_steps` (plus whatever `open_source` reads to open the extract folder).
Writes `out/checkpoints/` (resumable), `out/draft/` (the SGLang folder of the best epoch, tagged `draft_dir`),
`out/curves.png`, `out/val_samples.json` (each validation sample's loss and predicted tau under the exported
weights, for the sweep analysis' bootstrap; single-process runs), `out/metrics.json` and finally
`out/manifest.json`.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from draftlab.sglang import draft_provenance
from draftlab.util import fsutil
from draftlab.sglang.export import export_draft
from draftlab.model.draft import DraftModelConfig, Eagle3Draft
from draftlab.plan.plan_estimates import draft_shape
from draftlab.util.progress import StepBar
from draftlab.util.reporting import Reporter
from draftlab.train.history import replay_history
from draftlab.train.tau_curve import plot_tau_during_training, tau_during_training
from draftlab.train.checkpoint import load_trainable
from draftlab.train.loop import LoopSettings

log = logging.getLogger("draftlab")
FORMAT = "draftlab.train/1"


def draft_config(draft_cfg, manifest: dict, draft_vocab_size: int, max_seq_len: int) -> DraftModelConfig:
    """draft.* over the target's shape (None = the target's value); RoPE, eps and context from the target: the plan's
    `draft_shape` on the extract manifest's target config."""
    target = manifest["target"]
    text = dict(target.get("config") or {})
    text["hidden_size"] = text.get("hidden_size") or target["hidden_size"]
    layer_ids = manifest.get("layer_ids", manifest.get("layers"))
    return DraftModelConfig(**draft_shape(text, draft_cfg, list(layer_ids), draft_vocab_size, max_seq_len))


def build_model(cfg, source) -> tuple[Eagle3Draft, DraftModelConfig, torch.Tensor]:
    """The seeded draft, initialised from the target head; returns (model, its config, target lm_head)."""
    d2t, t2d = source.vocab()
    dcfg = draft_config(cfg.draft, source.manifest, len(d2t), cfg.train.max_seq_len)
    if len(d2t) != cfg.draft.vocab_size:
        log.warning("train: the extract vocab has %d entries, draft.vocab_size says %d; using %d",
                    len(d2t), cfg.draft.vocab_size, len(d2t))
    head = source.head()
    torch.manual_seed(cfg.train.seed)
    model = Eagle3Draft(dcfg)
    model.init_from_target(head["embed_tokens.weight"].float(), head["lm_head.weight"].float(), d2t, t2d,
                           freeze_head=bool(cfg.train.freeze_lm_head))
    return model, dcfg, head["lm_head.weight"]


def plot_curves(reporter_history: list[dict], history: list[dict], path: Path, steps: int) -> Path:
    """Loss and per-step accuracy curves (train loss per log window, validation per pass)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    train = [(s, m["train/loss"]) for s, m in reporter_history if "train/loss" in m]
    val = [(h["step"], h["val/loss"]) for h in history if "val/loss" in h]
    if train:
        ax1.plot(*zip(*train), label="train/loss")
    if val:
        ax1.plot(*zip(*val), "o-", label="val/loss")
    ax1.set_xlabel("optimizer step")
    ax1.set_ylabel("TTT loss")
    ax1.legend()
    for j in range(steps):  # against steps: with train.eval_every there are several passes per epoch
        pts = [(h["step"], h[f"val/acc_{j}"]) for h in history if f"val/acc_{j}" in h]
        if pts:
            ax2.plot(*zip(*pts), "o-", label=f"acc_{j}")
    ax2.set_xlabel("optimizer step")
    ax2.set_ylabel("val accuracy (teacher-forced)")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    with fsutil.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return path


def convergence(train_cfg, final: dict) -> dict[str, float]:
    """`train/converged` when early stopping watched the run: 1 = val/loss plateaued, 0 = the budget ran out first.
    A capped run is an under-trained draft, whatever its numbers: said in a warning, which the job's summary
    shows (and repeats when the stage is reused). Runs without early stopping trained to a chosen budget: no metric."""
    if not train_cfg.early_stop_patience:
        return {}
    converged = final.get("train/stopped_early") == 1.0
    if not converged:
        key, value = ("max_steps", train_cfg.max_steps) if train_cfg.max_steps else ("epochs", train_cfg.epochs)
        log.warning("train: NOT converged: the run used its whole budget (%d steps, train.%s=%d) without a val/loss "
                    "plateau, so this draft is under-trained; raise train.%s", int(final.get("train/steps", 0)), key,
                    value, key)
    return {"train/converged": float(converged)}


def budget_note(train_cfg) -> None:
    """train.max_steps replaces train.epochs as the budget: an epochs setting it overrides is said, not dropped."""
    if train_cfg.max_steps and train_cfg.epochs:
        log.warning("train: train.epochs=%d is not the budget: train.max_steps=%d replaces it (set "
                    "train.max_steps=null to train %d passes)", train_cfg.epochs, train_cfg.max_steps, train_cfg.epochs)


class _Recorder:
    """Forwards to the stage's reporter and keeps the train curve for the plot."""

    def __init__(self, inner: Reporter) -> None:
        self.inner, self.history = inner, []

    def metrics(self, values, step=None):
        self.history.append((step, dict(values)))
        self.inner.metrics(values, step)

    def artifact(self, path, subdir=None):
        self.inner.artifact(path, subdir)

    def tag(self, key, value):
        self.inner.tag(key, value)


def _steps_tokens(result, source) -> float:
    """Tokens (prompt and answer) this job's new steps trained on: its share of the epochs seen."""
    final = result.final
    return source.num_tokens("train") * final["train/epochs_seen"] * final["train/new_steps"] / max(result.steps, 1)


def run(cfg, out: Path, inputs: dict[str, Path], reporter: Reporter) -> dict[str, float]:
    from draftlab.data.reader import open_source  # written in parallel by the extract stage's owner

    from draftlab.train import distributed  # torchrun: rank 0 brings the other ranks into this stage

    out = Path(out)
    distributed.announce_train(cfg, out, inputs)
    if distributed.is_main():
        budget_note(cfg.train)
    source = open_source(cfg, inputs)
    model, dcfg, lm_head = build_model(cfg, source)
    settings = LoopSettings.from_cfg(cfg)
    recorder = _Recorder(reporter)
    trainer = distributed.make_trainer(model, source, lm_head, settings, out / "checkpoints", recorder)
    main = distributed.is_main()
    if cfg.train.bench_every and "generate" not in inputs:  # the prompts it benches on are generate's val split
        log.warning("train: train.bench_every is ignored: no generate stage among the inputs to take prompts from")
    elif cfg.train.bench_every and distributed.world_size() <= 1:  # one process serves the draft it benches
        from draftlab.train import bench_tau

        trainer.bench = bench_tau.from_config(cfg, Path(inputs["generate"]), dcfg)
    elif cfg.train.bench_every and main:
        log.warning("train: train.bench_every is ignored under torchrun: the bench stage measures the draft")
    progress = StepBar(trainer.state) if main else None
    trainer.on_step = progress
    if main:
        replay_history(out / "checkpoints", recorder)  # a resumed job's run holds the whole curve
    started = time.perf_counter()
    try:
        # A checkpoint is written into `.ckpt-*.tmp` and renamed: a kill or a full disk must not leave one behind.
        with fsutil.leftovers_removed(out / "checkpoints", ".ckpt-*.tmp"):  # the stage lock is held
            result = trainer.run(init_from=cfg.train.init_from)
        loop_seconds = time.perf_counter() - started
    finally:
        if progress is not None:
            progress.close()
    if not main:
        return {}  # rank 0 alone exports and writes

    load_trainable(trainer.model, result.best_weights)
    draft_dir = export_draft(trainer.model, dcfg, out / "draft", "bfloat16",
                             provenance=draft_provenance.from_extract_manifest(source.manifest))
    reporter.tag("draft_dir", str(draft_dir))
    curves = plot_curves(recorder.history, result.history, out / "curves.png", settings.ttt_steps)
    reporter.artifact(curves)
    during = {}
    if trainer.state.get("bench"):
        during = tau_during_training(result.history, trainer.state["bench"])
        reporter.artifact(plot_tau_during_training(result.history, trainer.state["bench"],
                                                   out / "tau_during_training.png"))
    by_sample = {}
    if distributed.world_size() <= 1:  # a sharded model's forward needs every rank; rank 0 alone runs this
        from draftlab.train.per_sample import FILE, per_sample_validation

        by_sample = per_sample_validation(trainer)
        fsutil.atomic_write_json(out / FILE, by_sample)
        reporter.artifact(out / FILE)

    metrics = {**result.final, **result.best, **convergence(cfg.train, result.final), **during,
               "train/steps": float(result.steps),
               # the data axis of a scaling sweep: tokens (prompt and answer) of the training split
               "train/train_tokens": float(source.num_tokens("train")),
               "train/train_samples": float(source.num_samples_in("train")),
               **({"val/samples": float(len(by_sample["index"]))} if by_sample else {}),
               # the loop's mean rate over this job's steps, validation, checkpoints, waits and graph loads included
               # (train/tokens_per_s is the last log window's: one window's snapshot)
               "train/mean_tokens_per_s": _steps_tokens(result, source) / max(loop_seconds, 1e-9),
               # the data-parallel trainer builds a core but runs the padded unroll: no compile metrics
               **(trainer.core.metrics() if trainer.core is not None and trainer.packed else {})}
    metrics.pop("epoch", None)
    fsutil.atomic_write_json(out / "metrics.json", metrics)
    fsutil.atomic_write_json(out / "manifest.json", {
        "format": FORMAT, "draft_dir": "draft", "draft_config": dcfg.to_dict(), "metrics": metrics,
        "history": result.history, "best_epoch": int(result.best["best/epoch"]), "complete": True,
    })
    return metrics
