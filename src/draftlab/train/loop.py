"""The training loop: AdamW, warmup + cosine|linear|constant schedule, grad clipping, token-budget batches,
per-epoch validation, best-epoch tracking and resumable checkpoints.

Resume contract: a killed run restarted on the same folder continues from its last checkpoint and ends where an
uninterrupted run would (bit-identical on CPU). A checkpoint holds the trainable weights and the AdamW state
(safetensors), the RNG states, and JSON for the rest: epoch, batch position, optimizer step (the schedule is a
pure function of it), the metric window and the per-epoch history. Nothing is ever unpickled.

Data: `source.batches(split, epoch, batch_tokens, max_seq_len, seed, shuffle)` must give the same batches for the
same arguments; resume skips the batches of the current epoch that were already consumed.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from draftlab import fsutil
from draftlab.config import TrainConfig
from draftlab.model.draft import Eagle3Draft
from draftlab.reporting import NullReporter, Reporter
from draftlab.target import resolve_device
from draftlab.train.ttt import STATS, summarize, target_distribution, ttt_unroll

log = logging.getLogger("draftlab")
CKPT_FORMAT = "draftlab.train-checkpoint/1"
KEEP_CHECKPOINTS = 2


@dataclass
class LoopSettings(TrainConfig):
    """The `train` config section (defaults are the schema's) plus the one serving setting metrics need."""

    num_steps: int = 4  # serve.num_steps: how many full_acc_j enter predicted_tau

    @classmethod
    def from_cfg(cls, cfg) -> "LoopSettings":
        return cls(**OmegaConf.to_container(cfg.train, resolve=True), num_steps=int(cfg.serve.num_steps))


@dataclass
class TrainResult:
    final: dict[str, float]  # last train window + last validation, prefixed
    best: dict[str, float]  # best/epoch, best/val_loss, best/predicted_tau, ...
    history: list[dict[str, float]]  # one entry per epoch (validation metrics, prefixed)
    best_weights: Path  # trainable weights of the best epoch (safetensors)
    steps: int = 0
    extras: dict[str, Any] = field(default_factory=dict)


def autocast_dtype(device: torch.device, dtype: str) -> torch.dtype | None:
    """None = plain fp32. Master weights stay fp32 either way; autocast runs the matmuls in bf16."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    if dtype == "float32":
        return None
    if dtype == "float16":
        raise ValueError("train.dtype: float16 needs loss scaling, which draftlab does not do; use bfloat16")
    return torch.bfloat16


def lr_factor(step: int, total: int, warmup_ratio: float, schedule: str) -> float:
    """Multiplier of train.lr for optimizer step `step` (0-based) out of `total`: linear warmup, then decay."""
    warmup = int(warmup_ratio * total)
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(model: torch.nn.Module, lr: float, weight_decay: float, device: torch.device):
    """AdamW with the EAGLE-3 paper's betas; no weight decay on norms (1-D weights)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Everything in the state dict except frozen parameters (the target embedding is re-copied on load)."""
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    return {k: v.detach().cpu() for k, v in model.state_dict().items() if k not in frozen}


def load_trainable(model: torch.nn.Module, path: Path) -> None:
    missing, unexpected = model.load_state_dict(load_file(str(path)), strict=False)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    if unexpected or set(missing) - frozen:
        raise ValueError(f"{path}: missing {sorted(set(missing) - frozen)}, unexpected {sorted(unexpected)}")


def _batches_per_epoch(source, s: LoopSettings) -> int:
    counter = getattr(source, "num_batches", None)
    if counter is not None:
        return int(counter("train", 0, s.batch_tokens, s.max_seq_len, s.seed))
    # No count offered by the source: one pass over epoch 0 (token-budget batching fixes the count per epoch).
    return sum(1 for _ in source.batches("train", 0, s.batch_tokens, s.max_seq_len, s.seed, True))


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder, a checkpoints/ folder or a train-stage folder -> the checkpoint folder."""
    path = Path(path)
    for candidate in (path, path / "checkpoints"):
        if (candidate / "trainer.json").exists():
            return candidate
        latest = fsutil.read_json(candidate / "latest.json")
        if latest:
            return candidate / latest["name"]
    raise FileNotFoundError(f"train.init_from: no checkpoint at {path}")


class Trainer:
    def __init__(self, model: Eagle3Draft, source, lm_head: torch.Tensor, settings: LoopSettings,
                 ckpt_dir: Path, reporter: Reporter | None = None,
                 on_step: Callable[[int], None] | None = None) -> None:
        self.s = settings
        self.device = resolve_device(settings.device)
        self.amp = autocast_dtype(self.device, settings.dtype)
        self.model = model.to(self.device)
        self.source = source
        # the target head in the matmul dtype: 1 GB instead of 2 for a 128k x 4096 head in bf16
        self.lm_head = lm_head.to(self.device, self.amp or torch.float32)
        self.ckpt_dir = Path(ckpt_dir)
        self.reporter = reporter or NullReporter()
        self.on_step = on_step
        self.opt = build_optimizer(self.model, settings.lr, settings.weight_decay, self.device)
        self.state: dict[str, Any] = {"epoch": 0, "batch": 0, "step": 0, "history": [], "best": None,
                                      "window": None, "total_steps": None}

    # ------------------------------------------------------------------ one batch
    def _to_device(self, batch: dict) -> dict:
        out = {k: v.to(self.device, non_blocking=True) for k, v in batch.items() if torch.is_tensor(v)}
        if self.amp is None:  # fp32 run: features may be stored in bf16
            out["features"] = out["features"].float()
            out["last_hidden"] = out["last_hidden"].float()
        return out

    def _forward(self, batch: dict):
        m = self.model
        amp = torch.autocast(self.device.type, dtype=self.amp) if self.amp else contextlib.nullcontext()
        with amp:
            targets = target_distribution(batch["last_hidden"], self.lm_head, m.d2t, m.t2d)
            return ttt_unroll(m, batch, targets, self.s.ttt_steps, self.s.loss_decay)

    def evaluate(self, split: str = "val") -> dict[str, float] | None:
        self.model.eval()
        total = None
        with torch.no_grad():
            for batch in self.source.batches(split, 0, self.s.batch_tokens, self.s.max_seq_len, self.s.seed, False):
                _, stats = self._forward(self._to_device(batch))
                total = stats if total is None else total + stats
        self.model.train()
        if total is None or float(total[STATS.index("n"), 0]) == 0:
            return None
        return summarize(total, self.s.loss_decay, self.s.num_steps)

    # ------------------------------------------------------------------ checkpoints
    # The state accessors are where data-parallel training (train/distributed.py, FSDP) gathers and scatters.
    def _model_tensors(self) -> dict[str, torch.Tensor]:
        return trainable_state(self.model)

    def _optimizer_state(self) -> dict:
        return self.opt.state_dict()

    def _write_weights(self, path: Path) -> None:
        fsutil.atomic_save_safetensors(path, self._model_tensors())

    def _load_states(self, model_file: Path, optimizer_state: dict) -> None:
        load_trainable(self.model, model_file)
        self.opt.load_state_dict(optimizer_state)

    def _save(self) -> None:
        name = f"ckpt-{self.state['step']:09d}-e{self.state['epoch']:04d}-b{self.state['batch']:09d}"  # sorts by age
        final = self.ckpt_dir / name
        tmp = self.ckpt_dir / f".{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        fsutil.atomic_save_safetensors(tmp / "model.safetensors", self._model_tensors())
        opt = self._optimizer_state()
        tensors = {f"{i}.{k}": v.detach().cpu() for i, st in opt["state"].items() for k, v in st.items()}
        fsutil.atomic_save_safetensors(tmp / "optimizer.safetensors", tensors)
        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng.update({f"cuda.{i}": t for i, t in enumerate(torch.cuda.get_rng_state_all())})
        fsutil.atomic_save_safetensors(tmp / "rng.safetensors", rng)
        state = dict(self.state, format=CKPT_FORMAT, param_groups=opt["param_groups"],
                     python_rng=list(random.getstate()), settings=vars(self.s))
        fsutil.atomic_write_json(tmp / "trainer.json", state)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        fsutil.atomic_write_json(self.ckpt_dir / "latest.json", {"name": name, "step": self.state["step"]})
        older = sorted(p for p in self.ckpt_dir.glob("ckpt-*") if p.name != name)
        for old in older[: max(0, len(older) - (KEEP_CHECKPOINTS - 1))]:
            shutil.rmtree(old, ignore_errors=True)

    def load(self, folder: Path, full: bool = True) -> None:
        """Restores weights, optimizer, RNG and position from a checkpoint folder."""
        folder = Path(folder)
        state = fsutil.read_json(folder / "trainer.json")
        if not state or state.get("format") != CKPT_FORMAT:
            raise ValueError(f"{folder}: not a {CKPT_FORMAT} checkpoint")
        tensors = load_file(str(folder / "optimizer.safetensors"))
        opt_state: dict[int, dict] = {}
        for key, value in tensors.items():
            index, name = key.split(".", 1)
            opt_state.setdefault(int(index), {})[name] = value
        self._load_states(folder / "model.safetensors", {"state": opt_state, "param_groups": state.pop("param_groups")})
        rng = load_file(str(folder / "rng.safetensors"))
        torch.set_rng_state(rng["torch"])
        cuda = [rng[k] for k in sorted(k for k in rng if k.startswith("cuda."))]
        if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        py = state.pop("python_rng")
        random.setstate((py[0], tuple(py[1]), py[2]))
        for key in ("format", "settings"):
            state.pop(key, None)
        self.state.update(state)
        if not full:  # continuing with a new horizon (train.init_from): keep weights, optimizer and history
            self.state["total_steps"] = None

    # ------------------------------------------------------------------ logging
    def _log_window(self, t0: float) -> float:
        window = self.state["window"]
        if not window:
            return t0
        stats = torch.tensor(window["stats"], dtype=torch.float64)
        metrics = {f"train/{k}": v for k, v in summarize(stats, self.s.loss_decay, self.s.num_steps).items()}
        elapsed = max(time.perf_counter() - t0, 1e-9)
        metrics["train/tokens_per_s"] = window["tokens"] / elapsed
        metrics["lr"] = self.opt.param_groups[0]["lr"]
        metrics["train/grad_norm"] = window["grad_norm"] / max(window["batches"], 1)
        metrics["epoch"] = float(self.state["epoch"])
        self.reporter.metrics(metrics, step=self.state["step"])
        self.state["last_train"] = metrics
        self.state["window"] = None
        return time.perf_counter()

    def _end_epoch(self, best_dir: Path) -> None:
        epoch = self.state["epoch"]
        val = self.evaluate("val")
        entry = {"epoch": float(epoch), "step": float(self.state["step"])}
        if val is not None:
            entry.update({f"val/{k}": v for k, v in val.items()})
            self.reporter.metrics(entry, step=self.state["step"])
        self.state["history"].append(entry)
        score = entry.get("val/loss", self.state.get("last_train", {}).get("train/loss", math.inf))
        best = self.state["best"]
        if best is None or score < best["score"]:
            file = best_dir / f"best-epoch{epoch}.safetensors"
            self._write_weights(file)
            self.state["best"] = {"epoch": epoch, "score": score, "file": file.name, "metrics": entry}
        self.state["epoch"], self.state["batch"] = epoch + 1, 0

    def _prune_best(self, best_dir: Path) -> None:
        keep = self.state["best"]["file"] if self.state["best"] else None
        for path in best_dir.glob("best-epoch*.safetensors"):
            if path.name != keep:
                path.unlink()

    # ------------------------------------------------------------------ the loop
    def run(self, init_from: str | Path | None = None) -> TrainResult:
        s = self.s
        latest = fsutil.read_json(self.ckpt_dir / "latest.json")
        if latest:
            self.load(self.ckpt_dir / latest["name"])
            log.info("train: resuming at epoch %d batch %d (step %d)", self.state["epoch"], self.state["batch"],
                     self.state["step"])
        elif init_from:
            source_ckpt = resolve_checkpoint(init_from)
            self.load(source_ckpt, full=False)
            if self.state["best"]:  # bring the best weights along so export works from this folder alone
                self.ckpt_dir.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source_ckpt.parent / self.state["best"]["file"], self.ckpt_dir / self.state["best"]["file"])
        else:
            torch.manual_seed(s.seed)
            random.seed(s.seed)
        if self.state["total_steps"] is None:
            self.state["total_steps"] = max(1, _batches_per_epoch(self.source, s) * s.epochs)
        total = self.state["total_steps"]
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.model.train()
        t0 = time.perf_counter()
        while self.state["epoch"] < s.epochs:
            epoch, skip = self.state["epoch"], self.state["batch"]
            for index, batch in enumerate(self.source.batches("train", epoch, s.batch_tokens, s.max_seq_len, s.seed, True)):
                if index < skip:
                    continue
                lr = s.lr * lr_factor(self.state["step"], total, s.warmup_ratio, s.schedule)
                for group in self.opt.param_groups:
                    group["lr"] = lr
                batch = self._to_device(batch)
                loss, stats = self._forward(batch)
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                norm = torch.nn.utils.clip_grad_norm_(params, s.grad_clip if s.grad_clip > 0 else float("inf"))
                self.opt.step()
                self.state["step"] += 1
                self.state["batch"] = index + 1
                self._accumulate(stats, batch, float(norm))
                if self.state["step"] % s.log_every == 0:
                    t0 = self._log_window(t0)
                if self.state["step"] % s.checkpoint_every == 0:
                    self._save()
                if self.on_step is not None:
                    self.on_step(self.state["step"])
            t0 = self._log_window(t0)
            self._end_epoch(self.ckpt_dir)
            self._save()
            self._prune_best(self.ckpt_dir)
        return self._result()

    def _accumulate(self, stats: torch.Tensor, batch: dict, grad_norm: float) -> None:
        # The window is kept as plain floats so a checkpoint can carry it; one host sync per step is cheap
        # next to a 7-step unroll, and the logged numbers then never depend on where a run was resumed.
        w = self.state["window"] or {"stats": [[0.0] * stats.shape[1] for _ in STATS], "tokens": 0.0,
                                     "grad_norm": 0.0, "batches": 0}
        w["stats"] = (torch.tensor(w["stats"], dtype=torch.float64) + stats.cpu()).tolist()
        w["tokens"] += float(batch["attention_mask"].sum())
        w["grad_norm"] += grad_norm
        w["batches"] += 1
        self.state["window"] = w

    def _result(self) -> TrainResult:
        best = self.state["best"]
        final = dict(self.state.get("last_train") or {})
        if self.state["history"]:
            final.update({k: v for k, v in self.state["history"][-1].items() if k.startswith("val/")})
        best_metrics = {"best/epoch": float(best["epoch"]), "best/step": best["metrics"]["step"]}
        bm = best["metrics"]
        if "val/loss" in bm:
            best_metrics.update({"best/val_loss": bm["val/loss"], "best/predicted_tau": bm["val/predicted_tau"],
                                 "best/val_acc_0": bm["val/acc_0"]})
        self.reporter.metrics(best_metrics, step=self.state["step"])
        return TrainResult(final=final, best=best_metrics, history=list(self.state["history"]),
                           best_weights=self.ckpt_dir / best["file"], steps=self.state["step"])
